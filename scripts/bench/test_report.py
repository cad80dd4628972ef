"""The Targets (issue 12) table's arithmetic (report.targets12) and the
reverse direction's table (reverse.section), over made-up results.

    python3 -m unittest discover -s scripts/bench -p 'test_*.py'
"""
import types
import unittest

import report
import reverse


def results():
    return {
        "direct": {"gbps1": [10.0, 10.0, 10.0], "conn_s": [1000, 1000, 1000]},
        "HAProxy": {"gbps1": [5.0], "conn_s": [800], "p99_us": [100]},
        "HAProxy 1 MiB pipes": {"gbps1": [6.0], "conn_s": [700], "p99_us": [90]},
        "HAProxy maxconn 16": {"fragile200_completed": [200]},
        "edgelinkd": {"gbps1": [6.0], "conn_s": [900], "p99_us": [95],
                      "fragile200_completed": [200, 200], "fragile1000_completed": [1000, 998]},
        "edgelinkd kernel path": {"gbps1": [9.0, 9.6, 9.8], "conn_s": [950]},
    }


def rows(r):
    return {(t[0], t[1]): t for t in report.targets12(r)}


class Targets12(unittest.TestCase):
    def test_each_ratio_is_against_its_own_reference(self):
        got = rows(results())
        k = got[("kernel path TCP 1 stream (Gbit/s)", "≥ 0.95× direct")]
        self.assertEqual(k[4], "0.96×")  # the median 9.6 over direct's 10
        self.assertEqual(k[5], "**met**")
        # The better HAProxy variant in each column.
        self.assertIn("HAProxy 1 MiB pipes", got[("kernel path TCP 1 stream (Gbit/s)", "≥ 1.30× HAProxy")][3])
        self.assertIn("(HAProxy)", got[("relay connections/s", "≥ 1.10× HAProxy")][3])

    def test_lower_is_better_for_latency(self):
        p99 = rows(results())[("relay request/reply p99 (µs)", "≤ 1.00× HAProxy")]
        self.assertIn("HAProxy 1 MiB pipes", p99[3])  # the lower p99 of the two
        self.assertEqual(p99[5], "missed: 6% over")

    def test_a_short_ratio_is_missed(self):
        conn = rows(results())[("relay connections/s", "≥ 1.10× HAProxy")]
        self.assertEqual(conn[4], "1.12×")
        r = results()
        r["edgelinkd"]["conn_s"] = [800]
        self.assertTrue(rows(r)[("relay connections/s", "≥ 1.10× HAProxy")][5].startswith("missed: 9% short"))

    def test_a_burst_is_met_only_when_every_run_completed_all(self):
        got = rows(results())
        self.assertEqual(got[("fragile device, burst of 200 clients (completed)", "200/200 every run")][5], "**met**")
        self.assertEqual(got[("fragile device, burst of 1000 clients (completed)", "1000/1000 every run")][5],
                         "missed: 998 of 1000 in the worst run")

    def test_unmeasured_subjects_say_so(self):
        r = results()
        del r["edgelinkd kernel path"]
        got = rows(r)
        self.assertEqual(got[("kernel path connections/s", "≥ 0.90× direct")][5], "not measured")


class ReverseSection(unittest.TestCase):
    """reverse.section: each subject's forward and reverse rows, then the
    ratios, over made-up results."""

    def subjects(self, peer=True):
        names = [reverse.ELK] + ([reverse.PEER] if peer else [])
        return [types.SimpleNamespace(name=n) for n in names]

    def results(self):
        r = results()
        r[reverse.ELK] = {"gbps1": [4.5], "cpu_per_gb": [0.3], "conn_s": [450, 540, 500], "conn_cpu_us": [200]}
        r[reverse.PEER] = {"gbps1": [3.0], "cpu_per_gb": [0.4], "conn_s": [1000], "conn_cpu_us": [100]}
        return r

    def rows(self, lines):
        return {tuple(c.strip() for c in l.strip("|").split("|")[:2]): [c.strip() for c in l.strip("|").split("|")[2:]]
                for l in lines if l.startswith("| ")}

    def test_rows_and_ratios(self):
        got = self.rows(reverse.section(self.subjects(), self.results(), {"iperf": 2, "short": 1}))
        self.assertEqual(got[("edgelinkd", "forward: client → pod → device")][0], "6.00")
        self.assertEqual(got[("edgelinkd", "reverse: device → pod net1 → cluster")][2], "500 (450–540)")
        self.assertEqual(got[("HAProxy 1 MiB pipes", "reverse: device → pod net1 → cluster")][0], "3.00")
        self.assertEqual(got[("*edgelinkd reverse ÷ forward*", "")][0], "0.75×")  # 4.5 over 6.0
        self.assertEqual(got[("*edgelinkd reverse ÷ forward*", "")][2], "0.56×")  # 500 over 900
        self.assertEqual(got[("*edgelinkd ÷ HAProxy 1 MiB pipes, reverse*", "")][0], "1.50×")
        self.assertEqual(got[("*edgelinkd ÷ HAProxy 1 MiB pipes, forward*", "")][0], "1.00×")

    def test_without_the_peer_or_a_figure(self):
        r = self.results()
        del r[reverse.PEER]
        del r[reverse.ELK]["cpu_per_gb"]
        got = self.rows(reverse.section(self.subjects(peer=False), r, {"iperf": 2, "short": 1}))
        self.assertEqual(got[("edgelinkd", "reverse: device → pod net1 → cluster")][1], "–")
        self.assertEqual(got[("*edgelinkd reverse ÷ forward*", "")][1], "–")
        self.assertFalse(any("HAProxy" in k[0] for k in got))


if __name__ == "__main__":
    unittest.main()
