#!/usr/bin/env python3
"""make soak: the soak scenarios, one process each (ONLY=tcp_hold,... picks
some). Durations: each file's docstring; QUICK=1 runs each for seconds.
Results: target/soak/NAME.json; figures: $SOAK_FIGURES (docs/figures)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

if __name__ == "__main__":
    sys.exit(common.run_all(os.path.dirname(os.path.abspath(__file__)),
                            ["attach_loop", "tcp_hold", "udp_sessions"]))
