"""A short run of the soak test (python -m tests.soak), so it cannot rot."""
import json

from tests import soak


def test_soak_smoke(capsys):
    assert soak.main(["--requests", "150", "--max-growth-mb", "256"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["requests"] == 150 and summary["errors"] == 0 and summary["mismatches"] == 0
    assert summary["greedy_checked"] > 0 and summary["cancelled"] > 0
    assert summary["engines"]["ssd-preempting"]["num_preemptions"] > 0
