#!/usr/bin/env python3
"""make chaos: the chaos scenarios, one process each (ONLY=kill9,... picks
some). Durations: each file's docstring; QUICK=1 shortens them.
Results: target/soak/NAME.json; figures: $SOAK_FIGURES (docs/figures)."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "soak"))
import common  # noqa: E402

if __name__ == "__main__":
    sys.exit(common.run_all(HERE, ["kill9", "netns_gone", "enospc", "truncated_record", "slow_target", "syn_flood"]))
