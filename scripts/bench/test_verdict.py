"""The bench's pass/fail checks (verdict.py) on made-up results: a broken
relay or CHECK fails the run, the peers' failures do not.

    python3 -m unittest discover -s scripts/bench -p 'test_*.py'
"""
import unittest

import verdict

PEERS = {"socat", "HAProxy", "nginx"}


def healthy():
    return {
        "direct": {"conn_failed": [0], "conn_ok": [9000], "ucheck_loss": [0.0]},
        "socat": {"conn_failed": [0], "conn_ok": [800], "idle_failed": [0], "idle_conns": [1000]},
        "edgelinkd": {"conn_failed": [0, 1], "conn_ok": [6000, 5999], "idle_failed": [0], "idle_conns": [1000],
                      "ucheck_loss": [0.0004], "u200_loss": [0.41],
                      "fragile200_completed": [200, 200], "fragile1000_completed": [1000],
                      "fragile200_p99_ms": [1200.0]},
        "HAProxy": {"fragile200_completed": [200]},
    }


class RelayChecks(unittest.TestCase):
    def test_a_healthy_run_passes(self):
        failed, notes = verdict.relay_checks(healthy(), PEERS)
        self.assertEqual(failed, [])
        self.assertEqual(notes, [])

    def test_overload_loss_is_a_figure_not_a_check(self):
        r = healthy()
        r["edgelinkd"]["u200_loss"] = [0.9]
        self.assertEqual(verdict.relay_checks(r, PEERS)[0], [])

    def test_failed_short_connections_fail_the_run_naming_the_figure(self):
        r = healthy()
        r["edgelinkd"]["conn_failed"] = [0, 30]
        failed, _ = verdict.relay_checks(r, PEERS)
        self.assertEqual(len(failed), 1)
        self.assertIn("conn_failed", failed[0])
        self.assertIn("round 2", failed[0])
        self.assertIn("30 of 6029", failed[0])

    def test_failed_idle_connections_fail_the_run(self):
        r = healthy()
        r["edgelinkd"]["idle_failed"] = [5]
        r["edgelinkd"]["idle_conns"] = [995]
        failed, _ = verdict.relay_checks(r, PEERS)
        self.assertEqual(len(failed), 1)
        self.assertIn("idle_failed", failed[0])

    def test_loss_at_the_check_load_fails_the_run(self):
        r = healthy()
        r["edgelinkd"]["ucheck_loss"] = [0.02]
        failed, _ = verdict.relay_checks(r, PEERS)
        self.assertEqual(len(failed), 1)
        self.assertIn("ucheck_loss", failed[0])
        self.assertIn("2.00%", failed[0])

    def test_at_the_bound_passes(self):
        r = healthy()
        r["edgelinkd"]["conn_failed"] = [1]
        r["edgelinkd"]["conn_ok"] = [999]
        r["edgelinkd"]["ucheck_loss"] = [verdict.UDP_LOSS_MAX]
        self.assertEqual(verdict.relay_checks(r, PEERS)[0], [])

    def test_a_peers_failures_are_noted_not_fatal(self):
        r = healthy()
        r["socat"]["conn_failed"] = [400]
        r["socat"]["idle_failed"] = [900]
        failed, notes = verdict.relay_checks(r, PEERS)
        self.assertEqual(failed, [])
        self.assertEqual(len(notes), 2)
        self.assertTrue(all("socat" in n for n in notes))

    def test_a_burst_edgelinkd_does_not_complete_fails_the_run(self):
        r = healthy()
        r["edgelinkd"]["fragile200_completed"] = [200, 199]
        r["edgelinkd"]["fragile1000_completed"] = [138]
        failed, notes = verdict.relay_checks(r, PEERS)
        self.assertEqual(notes, [])
        self.assertEqual(len(failed), 2)
        self.assertIn("burst of 200 clients (fragile200_completed), run 2", failed[0])
        self.assertIn("completed 199 of 200", failed[0])
        self.assertIn("burst of 1000 clients (fragile1000_completed), run 1", failed[1])
        self.assertIn("completed 138 of 1000", failed[1])
        self.assertIn("86.20% failed", failed[1])

    def test_a_burst_is_checked_whatever_its_size(self):
        r = healthy()
        r["edgelinkd"]["fragile50_completed"] = [49]
        failed, _ = verdict.relay_checks(r, PEERS)
        self.assertEqual(len(failed), 1)
        self.assertIn("49 of 50", failed[0])

    def test_a_burst_that_fails_completely_fails_the_run(self):
        r = healthy()
        r["edgelinkd"]["fragile200_completed"] = [0]
        failed, _ = verdict.relay_checks(r, PEERS)
        self.assertEqual(len(failed), 1)
        self.assertIn("completed 0 of 200", failed[0])

    def test_only_the_completed_counts_are_checked(self):
        r = healthy()
        r["edgelinkd"]["fragile200_p99_ms"] = [29000.0]
        r["edgelinkd"]["fragile200_seconds"] = [30.0]
        self.assertEqual(verdict.relay_checks(r, PEERS)[0], [])

    def test_a_peers_and_directs_incomplete_bursts_are_not_fatal(self):
        r = healthy()
        r["HAProxy"]["fragile200_completed"] = [150]
        r["direct"]["fragile200_completed"] = [94]
        failed, notes = verdict.relay_checks(r, PEERS)
        self.assertEqual(failed, [])
        self.assertEqual(len(notes), 1)
        self.assertIn("HAProxy completed 150 of 200", notes[0])

    def test_the_kernel_paths_failures_fail_the_run(self):
        r = healthy()
        r["edgelinkd kernel path"] = {"conn_failed": [40], "conn_ok": [9000], "ucheck_loss": [0.05]}
        failed, notes = verdict.relay_checks(r, PEERS)
        self.assertEqual(len(failed), 2)
        self.assertTrue(all("edgelinkd kernel path" in f for f in failed))
        self.assertEqual(notes, [])

    def test_the_reverse_directions_failures_fail_the_run_and_its_peers_do_not(self):
        r = healthy()
        r["reverse: edgelinkd"] = {"conn_failed": [0, 12], "conn_ok": [3000, 2988], "gbps1": [9.0, 9.1]}
        r["reverse: HAProxy 1 MiB pipes"] = {"conn_failed": [50], "conn_ok": [2950]}
        failed, notes = verdict.relay_checks(r, PEERS | {"reverse: HAProxy 1 MiB pipes"})
        self.assertEqual(len(failed), 1)
        self.assertIn("reverse: edgelinkd", failed[0])
        self.assertIn("round 2", failed[0])
        self.assertEqual(len(notes), 1)
        self.assertIn("reverse: HAProxy 1 MiB pipes", notes[0])

    def test_unmeasured_figures_are_not_checked(self):
        self.assertEqual(verdict.relay_checks({"edgelinkd": {}}, PEERS), ([], []))

    def test_the_section_says_failed(self):
        lines = verdict.section("Checks", ["x broke"], ["socat: y"])
        self.assertIn("- **FAILED**: x broke", lines)
        self.assertIn("- peer, not fatal: socat: y", lines)


class CniChecks(unittest.TestCase):
    def test_edgelinks_check_failures_fail_the_run(self):
        failed, notes = verdict.cni_checks({
            "edgelink bridge, no daemon": ['{"code": 114, "msg": "forward api is not served"}'],
            "reference bridge + host-local": ["bridge MAC changed", "again"],
        })
        self.assertEqual(len(failed), 1)
        self.assertIn("edgelink bridge, no daemon", failed[0])
        self.assertIn("1 time,", failed[0])
        self.assertEqual(len(notes), 1)
        self.assertIn("2 times", notes[0])

    def test_no_failures_pass(self):
        self.assertEqual(verdict.cni_checks({"edgelink macvlan": []}), ([], []))


if __name__ == "__main__":
    unittest.main()
