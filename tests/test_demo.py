"""roiops.demo: the printed story, the picture, and argument errors."""

import re

import pytest
import torch

from roiops import cli, demo

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _errors(text):
    """The mean |error| of RoIPool and RoIAlign and RoIAlign's with the other ``aligned``."""
    pool = float(re.search(r"RoIPool +mean \|error\| ([0-9.]+)", text).group(1))
    align = float(re.search(r"RoIAlign +mean \|error\| ([0-9.]+)", text).group(1))
    other = float(re.search(r"with aligned=\w+: ([0-9.]+)", text).group(1))
    return pool, align, other


def _assert_png(path):
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 50_000
    from matplotlib import image

    h, w = image.imread(path).shape[:2]
    assert w >= 1000 and h >= 1000


def test_default_example(tmp_path, capsys):
    out_png = tmp_path / "demo.png"
    assert demo.main(["--out", str(out_png)]) == 0
    text = " ".join(capsys.readouterr().out.split())  # the story is word-wrapped
    for fact in [
        "feature map of 25 x 25 cells",
        "665 x 665 px, pooled into 7 x 7 bins",
        "665/32 = 20.78 cells",
        "20.78/7 = 2.97 cells = 95.0 px",
        # RoIPool's real arithmetic: corners rounded, both end cells counted
        "x 2.19 -> 2, 22.97 -> 23; y 1.25 -> 1, 22.03 -> 22",
        "23 - 2 + 1 = 22 cells across",
        "floor(20.78) = 20 cells, bins of floor(20/7) = 2",
        "22/7 = 3.14 x 22/7 = 3.14 cells",
        "columns [2,6) [5,9) [8,12) [11,15) [14,18) [17,21) [20,24)",
        "each bin reads 4 x 4 cells",
        "miss the exact ones by up to 33.0 px",
        # RoIAlign
        "keeps 20.78 x 20.78 cells and bins of 2.97 x 2.97 cells",
        "2 x 2 points per bin (196 in all)",
        "reads 16 px right of and below",
        f"wrote {out_png}",
    ]:
        assert fact in text, fact
    pool, align, aligned = _errors(text)
    assert aligned < align < pool
    _assert_png(out_png)


def test_custom_box(tmp_path, capsys):
    out_png = tmp_path / "custom.png"
    argv = ["--box", "300", "250", "420", "330", "--stride", "16", "--output-size", "4",
            "--sampling-ratio", "0", "--aligned", "--out", str(out_png)]
    assert demo.main(argv) == 0
    text = " ".join(capsys.readouterr().out.split())
    for fact in [
        "120 x 80 px, pooled into 4 x 4 bins",
        "120/16 = 7.50 cells across and 5.00 cells down",
        "26 - 19 + 1 = 8 cells across, 21 - 16 + 1 = 6 cells down",
        "rows [16,18) [17,19) [19,21) [20,22)",
        "aligned=True, sampling_ratio=0: adaptive",
        "2 x 2 points per bin (64 in all)",
        "miss the exact ones by 0 px",
    ]:
        assert fact in text, fact
    pool, align, unaligned = _errors(text)
    assert align < unaligned and align < pool
    _assert_png(out_png)


def test_explain_prints_without_png(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["explain", "--box", "0", "0", "665", "665", "--no-png"]) == 0
    assert "665/32 = 20.78 cells" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv, message", [
    (["--box", "700", "0", "600", "100"], "--box must lie in the 800x800 image with x1 < x2"),
    (["--box", "0", "0", "900", "100"], "--box must lie"),
    (["--box", "-5", "0", "10", "10"], "--box must lie"),
    (["--box", "0", "0", "nan", "10"], "finite"),
    (["--box", "a", "0", "10", "10"], "invalid float value"),
    (["--box", "0", "0", "10"], "expected 4 arguments"),
    (["--stride", "0"], "--stride must be between 1 and 400"),
    (["--output-size", "0"], "--output-size must be between 1 and 32"),
    (["--out", "picture.jpg"], "--out must name a .png file"),
])
def test_bad_arguments_exit_with_a_clear_error(argv, message, capsys):
    assert demo.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "usage: roiops demo" in err


def test_exact_bin_means():
    image = torch.arange(3 * 32 * 40, dtype=torch.float64).view(3, 32, 40)
    got = demo.exact_bin_means(image, (8, 4, 24, 20), 2)
    torch.testing.assert_close(got[:, 0, 1], image[:, 4:12, 16:24].mean((1, 2)))
    # a bin edge through the middle of a pixel counts half of it
    half = demo.exact_bin_means(image, (0.5, 0, 1.5, 1), 1)
    torch.testing.assert_close(half[:, 0, 0], (image[:, 0, 0] + image[:, 0, 1]) / 2)


@pytest.mark.parametrize("box, stride, bins", [
    ((70, 40, 735, 705), 32, 7), ((300, 250, 420, 330), 16, 4), ((0, 0, 800, 800), 400, 7)])
def test_printed_windows_are_the_ones_roi_pool_uses(box, stride, bins):
    r = demo.compute(box, stride, bins, 2, False)
    for i, (h0, h1) in enumerate(r.y.pool_windows):
        for j, (w0, w1) in enumerate(r.x.pool_windows):
            cells = r.features[:, h0:h1, w0:w1]
            want = cells.amax((1, 2)) if cells.numel() else torch.zeros(3, dtype=torch.float64)
            assert torch.equal(r.pool[:, i, j], want), (i, j)


def _story(box, stride=32, bins=7, sampling_ratio=2, aligned=False):
    r = demo.compute(box, stride, bins, sampling_ratio, aligned)
    return r, " ".join(demo.story(r).split())


def _figure_texts(fig):
    """Every piece of text the picture shows, drawn, with its extent in pixels (tick labels,
    placed by matplotlib and partly outside the view, are left out)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    ticks = {id(t) for ax in fig.axes for t in ax.get_xticklabels() + ax.get_yticklabels()}
    return [(t.get_text(), t.get_window_extent(renderer)) for t in fig.findobj(Text)
            if t.get_visible() and t.get_text().strip() and id(t) not in ticks]


def test_points_per_bin_are_across_by_down():
    # a 320 x 96-px box in 2 x 2 bins of a stride-16 map, adaptive: 10 cells across, 3 down
    r, text = _story((0, 0, 320, 96), stride=16, bins=2, sampling_ratio=0)
    assert (r.x.grid, r.y.grid) == (10, 3)
    assert "it covers 320/16 = 20.00 cells across and 6.00 cells down" in text
    assert "samples 10 x 3 points per bin (120 in all)" in text
    labels = [t for t, _ in _figure_texts(demo.figure(r))]
    assert "sample points: 10 x 3 per bin, each interpolated from the 4 nearest cells" in labels
    assert "one RoIPool bin: 11 x 4 cells" in labels  # RoIPool's window: across x down as well


def test_a_box_under_one_cell_is_stretched_not_exact():
    r, text = _story((100, 100, 101, 101))
    assert "its bins are exact" not in text
    assert ("aligned=False stretches 0.031 x 0.031 cells to 1.00 x 1.00 cells, so its bins are "
            "0.14 x 0.14 cells (4.6 x 4.6 px instead of 0.1 x 0.1 px) and reach past the box's right "
            "and bottom edges") in text
    assert "--aligned removes both the stretch and this half-cell shift" in text

    _, text = _story((100, 100, 101, 300))  # only its width is under a cell
    assert "stretches 0.031 x 6.25 cells to 1.00 x 6.25 cells" in text
    assert "reach past the box's right edge;" in text

    _, text = _story((100, 100, 101, 101), aligned=True)  # aligned=True keeps the size
    assert "stretch" not in text and "miss the exact ones by 0 px" in text

    _, text = _story((70, 40, 735, 705))
    assert "stretch" not in text
    assert "its bins are exact, but aligned=False places the value of cell k at pixel 32k" in text


def test_picture_separates_snapping_from_the_max():
    r, text = _story(demo.DEFAULT_BOX)
    _, align, _ = _errors(text)
    pool = float(re.search(r"RoIPool +mean \|error\| ([0-9.]+)", text).group(1))
    snap = float(re.search(r"averaging the same windows instead: ([0-9.]+)", text).group(1))
    assert snap < pool / 3  # the max, not the snapping, is most of RoIPool's error here
    texts = _figure_texts(demo.figure(r))
    labels = " | ".join(t for t, _ in texts)
    for fact in [
        f"RoIPool's windows, averaged\nmean |error| {snap:.3f}",
        f"RoIPool output: their max\nmean |error| {pool:.3f}",
        f"RoIAlign output (aligned=False)\nmean |error| {align:.3f}",
        f"snapping the bins to whole cells ({snap:.3f} with its windows averaged)",
        f"taking the maximum instead of the mean ({snap:.3f} -> {pool:.3f})",
        "the bin highlighted on the left: 95 x 95 px, where it should be",  # the teal bin
        "where that bin should be: 95 x 95 px",
    ]:
        assert fact in labels, fact
    captions = " ".join(" ".join(t.split()) for t, _ in texts)
    assert "the max, taken channel by channel" in captions
    assert "a colour found nowhere in its window" in captions


@pytest.mark.parametrize("box, stride, bins, sampling_ratio, aligned", [
    (demo.DEFAULT_BOX, 32, 7, 2, False), ((100, 100, 101, 101), 32, 7, 2, False),
    ((0, 0, 320, 96), 16, 2, 0, False), ((0, 0, 800, 800), 400, 32, 0, True)])
def test_picture_text_fits_and_nothing_overlaps(box, stride, bins, sampling_ratio, aligned):
    fig = demo.figure(demo.compute(box, stride, bins, sampling_ratio, aligned))
    texts = _figure_texts(fig)
    page = fig.bbox
    for text, extent in texts:
        assert page.x0 <= extent.x0 and extent.x1 <= page.x1, text
        assert page.y0 <= extent.y0 and extent.y1 <= page.y1, text
    for i, (a, ea) in enumerate(texts):
        for b, eb in texts[i + 1:]:
            assert not ea.overlaps(eb), (a, b)
