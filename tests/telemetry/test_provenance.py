"""record.json: the machine's facts, the short name, the command line and the git state."""
import json
import subprocess
from pathlib import Path

import pytest
import torch

from ddp_lab.telemetry import provenance as prov

ZEN1 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 23
model\t\t: 1
model name\t: AMD EPYC 7551 32-Core Processor
flags\t\t: fpu sse2 avx avx2 fma

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 23
model\t\t: 1
model name\t: AMD EPYC 7551 32-Core Processor
flags\t\t: fpu sse2 avx avx2 fma avx512f
"""
XEON_AMX = ("vendor_id : GenuineIntel\ncpu family : 6\nmodel : 143\n"
            "model name : Intel(R) Xeon(R) Platinum 8480+\n"
            "flags : avx2 avx512f avx512_bf16 avx512_vnni amx_bf16 amx_tile amx_int8\n")


def test_cpu_facts_read_the_first_processor():
    facts = prov.cpu_facts(ZEN1)
    assert facts["cpu_model"] == "AMD EPYC 7551 32-Core Processor"
    assert (facts["cpu_vendor"], facts["cpu_family"], facts["cpu_model_number"]) == ("AuthenticAMD", 23, 1)
    # the second processor's extra flag is not the first's
    assert facts["cpu_flags"] == {"avx2": True, "avx512f": False, "avx512_bf16": False, "avx512_vnni": False,
                                  "amx_tile": False, "amx_bf16": False, "amx_int8": False}
    xeon = prov.cpu_facts(XEON_AMX)
    assert xeon["cpu_flags"]["amx_bf16"] and xeon["cpu_flags"]["avx512_bf16"]


def test_without_cpuinfo_the_flags_are_unknown_not_false():
    facts = prov.cpu_facts("")
    assert facts["cpu_flags"] is None and facts["cpu_family"] is None and facts["cpu_vendor"] is None


@pytest.mark.parametrize("cpuinfo, family, model, cores, gpus, name", [
    (ZEN1, None, None, 2, [], "zen1-2c"),
    (ZEN1, 23, 0x31, 64, [], "zen2-64c"),
    (ZEN1, 25, 0x11, 2, [], "zen3-2c"),         # no avx512f in the first processor's flags
    (ZEN1, 26, 2, 2, [], "zen5-2c"),
    (XEON_AMX, None, None, 2, [], "xeon-amx-2c"),
    (XEON_AMX, None, None, 16, ["NVIDIA H100 80GB HBM3"], "xeon-amx-16c-h100x1"),
])
def test_machine_short_name(cpuinfo, family, model, cores, gpus, name):
    facts = prov.cpu_facts(cpuinfo)
    if family is not None:
        facts["cpu_family"], facts["cpu_model_number"] = family, model
    facts.update(cores=cores, cuda_devices=gpus)
    assert prov.machine_short_name(facts) == name


def test_zen4_is_told_from_zen3_by_avx512():
    facts = prov.cpu_facts(ZEN1.replace("cpu family\t: 23\nmodel\t\t: 1", "cpu family\t: 25\nmodel\t\t: 17", 1)
                           .replace("fma\n", "fma avx512f\n", 1))
    facts.update(cores=4, cuda_devices=[])
    assert prov.machine_short_name(facts) == "zen4-4c"


def test_machine_facts_here():
    facts = prov.machine_facts()
    assert facts["torch"] == torch.__version__
    assert facts["cores"] >= 1 and 1 <= facts["cores_usable"] <= facts["cores"]
    assert facts["machine"].endswith(f"-{facts['cores']}c") or f"-{facts['cores']}c-" in facts["machine"]
    assert facts["date"].endswith("Z") and facts["date"][:2] == "20"
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                          cwd=Path(prov.__file__).parent).stdout.strip()
    assert facts["git_commit"] == head and len(head) == 40  # the tests run from a checkout
    assert isinstance(facts["git_dirty"], bool)


def test_no_checkout_gives_no_commit(tmp_path):
    package = tmp_path / "ddp_lab"
    package.mkdir()
    assert prov.git_state(package) == (None, None, None)
    # nor does a copy inside some other repository count as that repository's code
    subprocess.run(["git", "init", "-q", str(tmp_path / "repo")], check=True)
    inner = tmp_path / "repo" / "venv" / "site-packages" / "ddp_lab"
    inner.mkdir(parents=True)
    assert prov.git_state(inner) == (None, None, None)


def test_command_line_plain_and_under_torchrun(monkeypatch):
    for var in ("LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID", "GROUP_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    assert prov.command_line("ddp_lab.tools.bench.scaling", ["--worlds", "1,2"]) == \
        "python -m ddp_lab.tools.bench.scaling --worlds 1,2"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    assert prov.command_line("ddp_lab.tools.costmodel", ["inputs=[a.csv,b.csv]"]) == \
        "torchrun --nproc_per_node=3 -m ddp_lab.tools.costmodel 'inputs=[a.csv,b.csv]'"
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    assert prov.command_line("m", []).startswith("torchrun --nnodes=2 --nproc_per_node=3 -m m")
    assert prov.hydra_command("m") is None  # no Hydra app running here


def test_write_record(tmp_path):
    path = prov.write_record(tmp_path, "python -m ddp_lab.tools.bench.scaling", {"worlds": [1, 2]})
    record = json.loads(path.read_text())
    assert path == tmp_path / "record.json"
    assert record["record"] == 1 and record["command"] == "python -m ddp_lab.tools.bench.scaling"
    assert record["worlds"] == [1, 2]
    for key in ("date", "machine", "git_commit", "torch", "python", "cpu_model", "cores", "cpu_flags"):
        assert key in record
    with pytest.raises(FileExistsError):  # an earlier measurement's record stays
        prov.write_record(tmp_path, "other", {})
    assert json.loads(path.read_text())["command"] == "python -m ddp_lab.tools.bench.scaling"
    (tmp_path / "library").mkdir()
    called = json.loads(prov.write_record(tmp_path / "library", None).read_text())
    assert called["command"] is None and called["command_note"] == "called from Python, not from the command line"


RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"


def test_every_result_folder_has_a_record_and_a_row_in_the_index():
    index = (RESULTS / "README.md").read_text()
    records = sorted(d for d in RESULTS.iterdir() if (d / prov.RECORD_NAME).is_file())
    assert len(records) >= 29
    for folder in records:
        record = json.loads((folder / prov.RECORD_NAME).read_text())
        keys = {"command", "date", "machine", "git_commit", "torch", "python", "cpu_model", "cores", "cpu_flags"}
        assert keys <= set(record), (folder.name, keys - set(record))
        assert f"]({folder.name}/)" in index, f"docs/results/README.md has no row for {folder.name}"
