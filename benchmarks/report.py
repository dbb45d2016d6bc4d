"""BENCHMARKS.md's tables and the charts, regenerated from the result files in
benchmarks/results/.

A result file is a results.json as ``roiops bench --out DIR`` writes it, one per device;
a file transcribed from an earlier run may leave out the columns that run did not print,
and may name each row's run (``source``, a key of ``meta["sources"]``). BENCHMARKS.md
marks where each file's table goes:

    <!-- table: cpu.json -->
    (generated)
    <!-- end table -->

    python benchmarks/report.py            # rewrite the tables and docs/bench_<file>.png
    python benchmarks/report.py --check    # exit 1 if a table is not its file's

with roiops importable (``make bench-report`` runs it in the project's environment).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MARKDOWN = ROOT / "BENCHMARKS.md"
BLOCK = re.compile(r"(<!-- table: (\S+) -->\n)(.*?)(<!-- end table -->)", re.DOTALL)
DIRECTIONS = ("forward", "backward", "backward det", "forward+backward")


def load(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    data = json.loads(path.read_text())
    return data["meta"], data["rows"]


def number(x: float, digits: int) -> str:
    """x to at most `digits` significant digits, without trailing zeros but one decimal
    below 1000: 0.571, 12.2, 5.0, 1.65; a transcribed figure reads as it was printed."""
    if x == 0:
        return "0"
    text = f"{x:.{max(0, digits - 1 - math.floor(math.log10(abs(x))))}f}"
    if "." in text:
        text = text.rstrip("0")
        text += "0" if text.endswith(".") else ""
    return text


def cell(row: dict[str, Any]) -> str:
    text = number(row["roiops_ms"], 4)
    if row.get("ratio") is not None:
        text += f" ({number(row['ratio'], 3)}x)"
    return text + (f" [{row['source']}]" if "source" in row else "")


def setup(meta: dict[str, Any]) -> str:
    """One paragraph: where and how the file's figures were measured."""
    versions = ", ".join(f"{name} {version}" for name, version in meta["versions"].items())
    where = meta.get("gpu") or meta.get("cpu") or meta["device"]
    host = meta.get("host") or {}
    if host:
        load = host.get("load_average_1min")
        where += (f"; {host['os']}, {host['logical_cpus']} logical CPUs"
                  + (f", load average {load:.1f} at the start" if load is not None else ""))
    how = [f"`--order {meta['order']}`"]
    if "repeats" in meta:
        how.append(f"median of {meta['repeats']} timed calls after {meta['warmup']} warm-up")
    how.append(meta["timer"])
    lines = [f"**Setup:** {meta['date']}" + (f", commit {meta['commit']}" if meta.get("commit") else "")
             + f", {where}. {versions}. {'; '.join(how)}."]
    if "transcribed" in meta:
        lines.append(f"Transcribed {meta['transcribed']}.")
    return " ".join(lines)


def table(rows: list[dict[str, Any]]) -> list[str]:
    """A row per workload and layout (and dtype where the file has several), a column per
    thread count (where it has several) and direction; a cell is roiops' ms and, where
    there is a peer, the ratio (peer ms / roiops ms)."""
    def several(key: str) -> bool:
        return len({r[key] for r in rows if r.get(key) is not None}) > 1

    keys = ["workload", "layout"] + (["dtype"] if several("dtype") else [])
    threads = several("threads")
    groups: dict[tuple[str, ...], dict[tuple[int, int], dict[str, Any]]] = {}
    for r in rows:
        column = (r["threads"] if threads else 0, DIRECTIONS.index(r["direction"]))
        groups.setdefault(tuple(r[k] for k in keys), {})[column] = r
    columns = sorted({c for cells in groups.values() for c in cells})
    peers = several("peer")
    head = keys + (["peer"] if peers else []) + [
        (f"{t} thr " if threads else "") + DIRECTIONS[d] for t, d in columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * (len(head) - len(columns)) + "---:|" * len(columns)]
    for group, cells in groups.items():
        peer = [next((r["peer"] for r in cells.values() if r.get("peer")), "-")] if peers else []
        lines.append("| " + " | ".join([*group, *peer, *(cell(cells[c]) if c in cells else "-" for c in columns)])
                     + " |")
    return lines


def render(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """A file's block of BENCHMARKS.md: its setup, its table, then its runs and notes."""
    parts = [setup(meta), "", *table(rows)]
    sources = meta.get("sources", {})
    if sources:
        parts.append("")
        parts += [f"- [{key}] {s['date']}: {s['what']}; {s['statistic']}." for key, s in sources.items()]
    notes = [f"- {r['workload']}, {r['layout']}, {r['direction']}: {r['note']}." for r in rows if "note" in r]
    if notes:
        parts += ([] if sources else [""]) + notes
    return "\n".join(parts) + "\n"


def update(text: str, results: Path = RESULTS) -> str:
    """text with every marked table regenerated from its result file."""
    def block(match: re.Match[str]) -> str:
        path = results / match[2]
        if not path.is_file():
            raise SystemExit(f"report: BENCHMARKS.md asks for {match[2]}, and {path} does not exist")
        return match[1] + render(*load(path)) + match[4]

    return BLOCK.sub(block, text)


def chart(path: Path, out: Path) -> None:
    from roiops.bench import chart as draw

    meta, rows = load(path)
    # roiops bench's chart, which wants every column a full results.json has
    full = [{"threads": None, "dtype": None, "ratio": None, "peer": None, **r} for r in rows]
    draw(full, out, "CPU" if meta["device"] == "cpu" else meta.get("gpu") or meta["device"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if BENCHMARKS.md's tables are not those of the files")
    args = parser.parse_args(argv)
    text = MARKDOWN.read_text()
    new = update(text)
    if args.check:
        if new != text:
            print("report: BENCHMARKS.md's tables differ from benchmarks/results/: run python benchmarks/report.py",
                  file=sys.stderr)
            return 1
        return 0
    MARKDOWN.write_text(new)
    for name in BLOCK.findall(new):
        out = ROOT / "docs" / f"bench_{Path(name[1]).stem}.png"
        chart(RESULTS / name[1], out)
        print(f"wrote {out.relative_to(ROOT)}")
    print(f"wrote {MARKDOWN.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
