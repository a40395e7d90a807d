"""A step's predicted time: compute plus the sync's all-reduce, priced from a fit.csv."""
import pytest

from ddp_lab.config import ConfigError
from ddp_lab.tools import costmodel as cm
from ddp_lab.tools.costmodel.step_time import allreduce_ms, load_fit, predicted_step_ms

LENET_BYTES = 516_272


def _fit_csv(tmp_path):
    path = tmp_path / "fit.csv"
    path.write_text("algo,points,alpha_s,beta_s_per_byte,gamma_s_per_byte,median_abs_rel_err,max_abs_rel_err\n"
                    "builtin,10,1e-4,8e-9,2e-10,0.01,0.02\nnaive,10,2e-4,8e-9,2e-10,0.01,0.02\n")
    return path


def test_the_sync_algorithm_and_compression_choose_formula_and_bytes(tmp_path):
    fit = load_fit(_fit_csv(tmp_path))
    assert fit["builtin"].beta == 8e-9
    full = cm.ring(4, LENET_BYTES, 1e-4, 8e-9, 2e-10) * 1e3
    assert allreduce_ms(fit, "flat/builtin", "lenet", 4) == pytest.approx(full)
    assert allreduce_ms(fit, "flat/builtin+bf16", "lenet", 4) == pytest.approx(
        cm.ring(4, LENET_BYTES // 2, 1e-4, 8e-9, 2e-10) * 1e3)
    assert allreduce_ms(fit, "ddp/naive", "lenet", 4) == pytest.approx(
        cm.naive(4, LENET_BYTES, 2e-4, 8e-9, 2e-10) * 1e3)
    assert allreduce_ms(fit, "flat/ring", "lenet", 4) is None  # ring was not fitted
    assert predicted_step_ms(fit, "flat/builtin", "lenet", 4, compute_ms=20.0) == pytest.approx(20 + full)


def test_a_file_that_is_no_fit_is_refused(tmp_path):
    bad = tmp_path / "x.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ConfigError, match="not a cost model fit.csv"):
        load_fit(bad)
