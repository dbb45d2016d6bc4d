"""BENCHMARKS.md's summary, tables and the charts, regenerated from the result files in
benchmarks/results/.

A result file is a results.json as ``roiops bench --out DIR`` writes it, one per device;
a file transcribed from an earlier run may leave out the columns that run did not print,
and may name each row's run (``source``, a key of ``meta["sources"]``, where that run's
date, commit and what it timed are kept). BENCHMARKS.md marks where each file's table
goes, and where the summary of all of them against their targets (``Bench.target``) goes:

    <!-- summary -->
    (generated)
    <!-- end summary -->
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

from roiops.bench import OPS, WORKLOADS
from roiops.bench._case import Target

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MARKDOWN = ROOT / "BENCHMARKS.md"
BLOCK = re.compile(r"(<!-- table: (\S+) -->\n)(.*?)(<!-- end table -->)", re.DOTALL)
SUMMARY = re.compile(r"(<!-- summary -->\n)(.*?)(<!-- end summary -->)", re.DOTALL)
DIRECTIONS = ("forward", "backward", "backward det", "forward+backward")
JUDGED_DTYPE = "float32"
JUDGED_THREADS = 2   # on the CPU; a target may also set the forward's at 1 thread


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
    """A row per workload (and dtype where the file has several), a column per layout and
    thread count (where it has several) and direction; a cell is roiops' ms and, where
    there is a peer, the ratio (peer ms / roiops ms)."""
    def values(key: str) -> list[Any]:
        return list(dict.fromkeys(r[key] for r in rows if r.get(key) is not None))

    keys = ["workload"] + (["dtype"] if len(values("dtype")) > 1 else [])
    layouts = values("layout") if len(values("layout")) > 1 else []
    threads = len(values("threads")) > 1
    groups: dict[tuple[str, ...], dict[tuple[int, int, int], dict[str, Any]]] = {}
    for r in rows:
        column = (layouts.index(r["layout"]) if layouts else 0, r["threads"] if threads else 0,
                  DIRECTIONS.index(r["direction"]))
        groups.setdefault(tuple(r[k] for k in keys), {})[column] = r
    columns = sorted({c for cells in groups.values() for c in cells})
    peers = len(values("peer")) > 1
    head = keys + (["peer"] if peers else []) + [
        " ".join(layouts[layout:layout + 1] + ([f"{t} thr"] if threads else []) + [DIRECTIONS[d]])
        for layout, t, d in columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * (len(head) - len(columns)) + "---:|" * len(columns)]
    for group, cells in groups.items():
        peer = [next((r["peer"] for r in cells.values() if r.get("peer")), "-")] if peers else []
        lines.append("| " + " | ".join([*group, *peer, *(cell(cells[c]) if c in cells else "-" for c in columns)])
                     + " |")
    return lines


def runs(meta: dict[str, Any], name: str) -> str:
    """The runs a cell's bracket names, their dates and commits (the rest of what each run
    was is kept in the file)."""
    alike: dict[str, list[str]] = {}
    for key, s in meta["sources"].items():
        alike.setdefault(s["date"] + (f", commit {s['commit']}" if s.get("commit") else ""), []).append(f"[{key}]")
    return ("Runs in brackets: " + "; ".join(f"{' '.join(keys)} {when}" for when, keys in alike.items())
            + f" (what each timed: `sources` in benchmarks/results/{name}).")


def render(meta: dict[str, Any], rows: list[dict[str, Any]], name: str) -> str:
    """A file's block of BENCHMARKS.md: its setup and runs, its table, then its notes."""
    parts = [setup(meta) + (f" {runs(meta, name)}" if meta.get("sources") else ""), "", *table(rows)]
    notes = [f"- {r['workload']}, {r['layout']}, {r['direction']}: {r['note']}." for r in rows if "note" in r]
    return "\n".join(parts + ([""] + notes if notes else [])) + "\n"


def where(meta: dict[str, Any]) -> str:
    """The device, as the summary and the chart name it."""
    return "CPU" if meta["device"] == "cpu" else meta.get("gpu") or meta["device"]


def at_setting(row: dict[str, Any], threads: int = JUDGED_THREADS) -> bool:
    """Whether a row has a peer's ratio for a direction targets judge, at the setting they
    are judged at (float32; on the CPU, `threads` threads)."""
    return (row["direction"] in ("forward", "backward") and row.get("ratio") is not None
            and row.get("dtype", JUDGED_DTYPE) == JUDGED_DTYPE and row.get("threads") in (None, threads))


def goal(target: Target, row: dict[str, Any]) -> float | None:
    """The ratio a row must reach under target; None: the row is not judged."""
    if at_setting(row):
        value = getattr(target, row["direction"])
        return value[row["layout"]] if isinstance(value, dict) else value
    if target.one_thread is not None and row["direction"] == "forward" and at_setting(row, threads=1):
        return target.one_thread
    return None


def verdict(target: Target, rows: list[dict[str, Any]]) -> str:
    """'met', 'missed: forward' and so on, from the rows' ratios; '-' where none is judged."""
    goals = [(r, goal(target, r)) for r in rows]
    if all(g is None for _, g in goals):
        return "-"
    missed = [d for d in ("forward", "backward")
              if any(r["direction"] == d and g is not None and r["ratio"] < g for r, g in goals)]
    return "missed: " + ", ".join(missed) if missed else "met"


def span(ratios: list[float]) -> str:
    """'0.8-1.65x', or '2.0x' for one value, '-' for none."""
    if not ratios:
        return "-"
    low, high = number(min(ratios), 3), number(max(ratios), 3)
    return f"{low}x" if low == high else f"{low}-{high}x"


def describe(target: Target) -> str:
    """'>= 10x / >= 5x': the forward's and the backward's minimum ratios ('-' for an entry
    without a backward)."""
    def minimum(value: float | dict[str, float]) -> str:
        if isinstance(value, dict):
            return ", ".join(f">= {v:.2g}x {layout}" for layout, v in value.items())
        return f">= {value:.2g}x"

    one_thread = f", >= {target.one_thread:.2g}x at 1 thread" if target.one_thread is not None else ""
    backward = "-" if target.backward is None else minimum(target.backward)
    return f"{minimum(target.forward)}{one_thread} / {backward}"


def summary(files: list[tuple[dict[str, Any], list[dict[str, Any]]]]) -> str:
    """A row per operator and device: its ratio ranges at the judged setting, its target
    and whether the run met it."""
    op = {w.name: w.op for w in WORKLOADS}
    lines = [f"Ratio ranges over each operator's workloads and layouts in {JUDGED_DTYPE}, at {JUDGED_THREADS} "
             "threads on the CPU, from the tables below; met: every judged row of that run reaches the target "
             "(each operator's in roiops/bench/<op>.py); -: no target there.", "",
             "| operator | device | forward | backward | target: forward / backward | met |",
             "|---|---|---:|---:|---|---|"]
    for key in OPS:
        for meta, rows in files:
            mine = [r for r in rows if op[r["workload"]] == key]
            if not mine:
                continue
            ranges = [span([r["ratio"] for r in mine if at_setting(r) and r["direction"] == d])
                      for d in ("forward", "backward")]
            target = OPS[key].target
            goals = (["-", "-"] if target is None or meta["device"] not in target.devices
                     else [describe(target), verdict(target, mine)])
            lines.append("| " + " | ".join([key, where(meta), *ranges, *goals]) + " |")
    return "\n".join(lines) + "\n"


def update(text: str, results: Path = RESULTS) -> str:
    """text with every marked table, and the summary of them all, regenerated from the
    result files."""
    def named(name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        path = results / name
        if not path.is_file():
            raise SystemExit(f"report: BENCHMARKS.md asks for {name}, and {path} does not exist")
        return load(path)

    files = {name: named(name) for _, name, _, _ in BLOCK.findall(text)}
    text = BLOCK.sub(lambda m: m[1] + render(*files[m[2]], m[2]) + m[4], text)
    return SUMMARY.sub(lambda m: m[1] + summary(list(files.values())) + m[3], text)


def chart(path: Path, out: Path) -> None:
    from roiops.bench import chart as draw

    meta, rows = load(path)
    # roiops bench's chart, which wants every column a full results.json has
    full = [{"threads": None, "dtype": None, "ratio": None, "peer": None, **r} for r in rows]
    draw(full, out, where(meta))


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
