"""compare_profiles: two traces of the same step, one doing more, show the difference and nothing else."""
from __future__ import annotations

import torch

from ddp_lab.telemetry.profiling import StepProfiler
from ddp_lab.tools.bench import compare_profiles


def profiled(tmp_path, name: str, extra_norms: int):
    """A trace of 3 steps of a tiny training step, with `extra_norms` more norms a step."""
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    prof = StepProfiler(True, 1, 3, tmp_path / name, 0, cuda=False)
    for _ in range(6):
        model(torch.randn(16, 8)).square().mean().backward()
        for _ in range(extra_norms):
            torch.linalg.vector_norm(model.weight.grad)
        opt.step()
        opt.zero_grad()
        prof.step()
    prof.close()
    return str(tmp_path / name / "profile" / "rank0.json")


def test_the_step_that_does_more_shows_it_and_only_it(tmp_path, capsys):
    more, plain = profiled(tmp_path, "more", 2), profiled(tmp_path, "plain", 0)
    a, b = compare_profiles.read(more), compare_profiles.read(plain)
    assert len(a.steps) == len(b.steps) == 3 and a.kernels == b.kernels == 0
    assert a.per_step(a.top, "aten::linalg_vector_norm") == 2 and b.per_step(b.top, "aten::linalg_vector_norm") == 0
    assert a.per_step(a.top, "aten::linear") == b.per_step(b.top, "aten::linear") == 1
    compare_profiles.main([more, plain, "--rows", "5"])
    out = capsys.readouterr().out
    assert "3 steps of" in out and "2.00       0.00  aten::linalg_vector_norm" in out
    table = out.split("top-level ops a step: first, second\n")[1].split("host ms")[0]
    assert [line.split()[-1] for line in table.splitlines()] == ["aten::linalg_vector_norm"]


def test_a_cuda_traces_gpu_side_step_marks_are_not_counted_as_steps(tmp_path):
    """A CUDA trace marks each step twice (the host's user_annotation and the GPU's gpu_user_annotation):
    its steps are the host's."""
    import json
    events = []
    for i in range(2):
        events += [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "ts": 100 * i, "dur": 90,
                    "tid": 1},
                   {"ph": "X", "cat": "gpu_user_annotation", "name": f"ProfilerStep#{i}", "ts": 100 * i + 5,
                    "dur": 90, "tid": 7},
                   {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 100 * i + 10, "dur": 20, "tid": 7},
                   {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 100 * i + 1, "dur": 30, "tid": 1}]
    (tmp_path / "t.json").write_text(json.dumps({"traceEvents": events}))
    s = compare_profiles.read(str(tmp_path / "t.json"))
    assert s.steps == [0.09, 0.09] and s.kernels / len(s.steps) == 1 and s.per_step(s.top, "aten::mm") == 1
