"""The benchmark suite runs end to end (tiny shapes: this checks the plumbing, not speed)."""

import json

from roiops import cli


def test_bench_tiny(tmp_path, capsys):
    assert cli.main(["bench", "--tiny", "--quick", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert {r["direction"] for r in data["rows"]} == {"forward", "backward"}
    assert {r["layout"] for r in data["rows"]} == {"NCHW", "channels_last"}
    assert all(r["roiops_ms"] > 0 and r["torchvision_ms"] > 0 for r in data["rows"])
    assert data["meta"]["torch"] and data["meta"]["cpu"]
    assert (tmp_path / "ratios.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "ratio" in capsys.readouterr().out
