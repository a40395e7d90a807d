"""bench.run_plot: a picture of a run, into the run directory by default, never over another file."""
import pytest
from torch.utils.tensorboard import SummaryWriter

from ddp_lab.tools.bench import run_plot


def _run_dir(tmp_path):
    run = tmp_path / "run"
    with SummaryWriter(str(run / "tb")) as w:
        for epoch, step in enumerate((8, 16)):
            w.add_scalar("loss/train", 2.0 - epoch, step)
            w.add_scalar("acc/train", 0.5 + 0.2 * epoch, step)
            w.add_scalar("acc/test", 0.4 + 0.2 * epoch, step)
            w.add_scalar("perf/samples_per_sec", 1000.0 + epoch, step)
    return run


def test_the_picture_goes_to_the_run_directory_and_is_never_drawn_over(tmp_path, capsys):
    run = _run_dir(tmp_path)
    run_plot.main([str(run)])
    assert (run / "run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    before = (run / "run.png").read_bytes()
    with pytest.raises(SystemExit):
        run_plot.main([str(run)])
    assert f"{run / 'run.png'} exists already: give another path for the picture" in capsys.readouterr().err
    assert (run / "run.png").read_bytes() == before
    run_plot.main([str(run), str(tmp_path / "other.png"), "--title", "tiny"])
    assert (tmp_path / "other.png").stat().st_size > 10_000


def test_a_folder_without_a_run_is_named(tmp_path):
    (tmp_path / "tb").mkdir()
    with pytest.raises(SystemExit, match="not a ddp_lab.train run that finished an epoch"):
        run_plot.main([str(tmp_path)])
