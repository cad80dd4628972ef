"""The soak and chaos scenarios' own arithmetic and leak checks
(scripts/soak/common.py), on made-up data: no namespace, no binary.

    python3 -m unittest discover -s scripts/soak -p 'test_*.py'
"""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


class Slope(unittest.TestCase):
    def test_a_flat_series_has_no_slope_and_a_growing_one_its_rate_per_minute(self):
        self.assertEqual(common.slope_kb_per_min([(t, 5000) for t in range(100)]), 0.0)
        self.assertAlmostEqual(common.slope_kb_per_min([(t, 2 * t) for t in range(100)]), 120.0)
        self.assertEqual(common.slope_kb_per_min([(0, 1)]), 0.0)

    def test_the_second_half_tells_a_growth_that_stopped(self):
        pts = [(t, min(t, 50) * 10) for t in range(100)]
        self.assertGreater(common.slope_kb_per_min(pts), 0)
        self.assertEqual(common.second_half_slope(pts), 0.0)


class Leaks(unittest.TestCase):
    def test_state_listing_keeps_records_and_reservations_and_skips_what_stays_by_design(self):
        with tempfile.TemporaryDirectory() as d:
            for rel in ("attachments/c1_net1.json", "attachments/.tmp.1.0", "ipam/n/10.0.0.2",
                        "ipam/n/owners/c1_net1", "ipam/n/lock", "ipam/n/last_reserved_ip.0",
                        "ipam/n/sticky/ns_pod_net1", "locks/bridge-edge0.lock", "edgelinkd.sock"):
                os.makedirs(os.path.dirname(os.path.join(d, rel)), exist_ok=True)
                open(os.path.join(d, rel), "w").close()
            self.assertEqual(common.state_listing(d), ["attachments/.tmp.1.0", "attachments/c1_net1.json",
                                                       "ipam/n/10.0.0.2", "ipam/n/owners/c1_net1"])
            self.assertEqual(common.sticky_count(d), 1)

    def test_pooled_pipes_are_not_a_leak_other_descriptors_are(self):
        self.assertFalse(common.fd_leak((40, 0), (40, 188)))
        self.assertTrue(common.fd_leak((40, 0), (41, 0)))
        self.assertTrue(common.fd_leak((40, 0), (40, common.PIPE_POOL_FDS + 2)))
        self.assertEqual(common.fmt_fds((40, 4)), "40 (+4 pooled pipe fds)")

    def test_own_descriptors_are_counted_apart_from_pipes(self):
        r, w = os.pipe()
        try:
            other, pipes = common.fds_but_pipes(os.getpid())
            self.assertGreaterEqual(pipes, 2)
            self.assertEqual(other + pipes, common.fd_count(os.getpid()) - 1)  # less listdir's own
        finally:
            os.close(r)
            os.close(w)


class Http(unittest.TestCase):
    def test_chunked_bodies_are_joined(self):
        self.assertEqual(common.dechunk(b"4\r\nedge\r\n4\r\nlink\r\n0\r\n\r\n"), b"edgelink")


if __name__ == "__main__":
    unittest.main()
