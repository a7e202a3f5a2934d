"""`lab.triton.configs.write_config`, the step of notebooks 6 and 7 between what a student types and the
file Triton reads: the typed fields go into the model's config.pbtxt in the repository Triton
serves from, checked and adapted to the server first; the student's own `load_model` makes Triton
read it. Against the session's real Triton, what it serves after that load is what was written."""

from __future__ import annotations

from pathlib import Path

import pytest
import tritonclient.http as triton_http

from servelab import paths
from servelab.lab import Lab
from servelab.lab.triton_configs import TypedConfigError
from servelab.profiles import profile
from servelab.service.hardware import Hardware
from servelab.triton import server as triton_local
from servelab.triton.config import TritonConfig
from servelab.triton.models import ModelRepository
from servelab.triton.server import LOCAL_TRITON

MODEL = "food_classifier_onnx"  # the quickest to reload: ONNX Runtime in the Python backend, no PyTorch
NO_GPU = Hardware(gpus=0, cores=2, backends=("python",))
TWO_GPUS = Hardware(gpus=2, cores=16, backends=("onnxruntime", "python"))


def lab_with(repository, server: Hardware = LOCAL_TRITON, http: str = "127.0.0.1:1") -> Lab:
    return Lab("local", profile("quick"), {}, http, None, repository, triton_server=server)


def staged_for(server: Hardware, repository: Path) -> Path:
    """`food_classifier` staged in `repository` for `server` as the lab stages it; its config.pbtxt."""
    model = ModelRepository().get("food_classifier")
    triton_local.stage_model(model, repository / model.name, server, prelude="")
    return repository / model.name / "config.pbtxt"


@pytest.fixture
def staged(built_artifacts, tmp_path) -> Path:
    """food_classifier staged for a server without a GPU (nothing here loads it)."""
    return staged_for(NO_GPU, tmp_path / "models")


@pytest.mark.parametrize(
    ("typed", "said"),
    [
        (
            "instance_group [ { cout: 2, kind: KIND_CPU } ]",
            "an instance_group has no field 'cout'; did you mean 'count'?",
        ),
        ("instance_group [ { count: 2, kind: KIND_GUP } ]", "has no value 'KIND_GUP'; did you mean 'KIND_GPU'?"),
        ("dynamic_batching { preferred_batch_size: [ 4, 32 ] }", "preferred_batch_size 32 must be between 1 and"),
        ('name: "food_classifier_onnx"', 'the text says name: "food_classifier_onnx"; this file is food_classifier\'s'),
        ("", "the text writes no field"),
    ],
)
def test_typed_text_the_lab_will_not_write_says_what_to_change_and_leaves_the_file(staged, typed, said, capsys):
    before = staged.read_text()
    with pytest.raises(TypedConfigError) as refused:
        lab_with(staged.parent.parent).triton.configs.write_config(staged, typed)
    assert said in str(refused.value)
    assert str(refused.value).endswith(f"Nothing was written: {staged} is as it was.")
    # A notebook shows the message alone, not a traceback through the lab (IPython's hook).
    assert refused.value._render_traceback_() == str(refused.value).splitlines()
    assert staged.read_text() == before and capsys.readouterr().out == ""


def test_a_file_triton_does_not_read_is_refused_naming_those_it_does(staged, tmp_path):
    elsewhere = tmp_path / "copy" / "food_classifier" / "config.pbtxt"
    elsewhere.parent.mkdir(parents=True)
    elsewhere.write_text(staged.read_text())
    lab = lab_with(staged.parent.parent)
    with pytest.raises(TypedConfigError, match="is not a file this Triton reads: each model's is lab.repository"):
        lab.triton.configs.write_config(elsewhere, "instance_group [ { count: 2 } ]")
    with pytest.raises(TypedConfigError, match="food_classifier, food_classifier_onnx"):
        lab.triton.configs.write_config(tmp_path / "nope" / "config.pbtxt", "instance_group [ { count: 2 } ]")


def test_typed_fields_replace_the_file_s_own_and_keep_its_other_lines(built_artifacts, tmp_path, capsys):
    staged = staged_for(TWO_GPUS, tmp_path / "models")  # as on the GPU node
    lab = lab_with(staged.parent.parent, TWO_GPUS)
    typed = "instance_group [ { count: 2, kind: KIND_GPU, gpus: [ 0, 1 ] } ]"
    assert lab.triton.configs.write_config(staged, typed) == staged
    written = TritonConfig.read(staged)
    (group,) = written.proto.instance_group
    assert (group.count, list(group.gpus)) == (2, [0, 1])
    assert written.proto.max_batch_size == 16 and "# Food-11 classifier, Python backend" in written.text
    printed = capsys.readouterr().out
    assert printed.startswith(f"{staged}, as Triton reads it at the next load of food_classifier:\n\n")
    assert printed.endswith(written.text + "\n") and "Adapted" not in printed  # the node's server: as typed
    # The next edit starts from the file as it is now: dynamic batching added, the two groups kept.
    lab.triton.configs.write_config(staged, "dynamic_batching { max_queue_delay_microseconds: 100 }")
    again = TritonConfig.read(staged).proto
    assert again.dynamic_batching.max_queue_delay_microseconds == 100 and again.instance_group[0].count == 2


def test_without_a_gpu_the_file_gets_cpu_instances_and_the_student_sees_why(staged, capsys):
    lab = lab_with(staged.parent.parent, NO_GPU)
    lab.triton.configs.write_config(staged, "instance_group [ { count: 2, kind: KIND_GPU, gpus: [ 0 ] } ]")
    (group,) = TritonConfig.read(staged).proto.instance_group
    assert (group.count, group.kind, list(group.gpus)) == (2, group.KIND_CPU, [])
    printed = capsys.readouterr().out
    assert "(no GPU, 2 CPU core(s), backends python): it has no GPU, so each KIND_GPU group runs its count" in printed
    assert "-    kind: KIND_GPU\n-    gpus: [ 0 ]\n+    kind: KIND_CPU\n" in printed  # the diff: typed, then served
    assert printed.endswith(staged.read_text() + "\n")  # then the whole file, as written


@pytest.mark.integration
def test_what_triton_serves_after_load_model_is_the_file_written(ports, capsys):
    address = f"127.0.0.1:{ports.triton_http}"
    lab = lab_with(paths.TRITON_DIR / "models", http=address)
    triton = triton_http.InferenceServerClient(address, network_timeout=600)
    config_file = paths.TRITON_DIR / "models" / MODEL / "config.pbtxt"
    as_staged = config_file.read_text()

    def served_groups() -> list[tuple[int, str]]:
        return [(group["count"], group["kind"]) for group in triton.get_model_config(MODEL)["instance_group"]]

    try:
        lab.triton.configs.write_config(config_file, "instance_group [ { count: 2, kind: KIND_GPU, gpus: [ 0 ] } ]")
        assert served_groups() == [(1, "KIND_CPU")], "written, not yet loaded: Triton serves what it read before"
        triton.load_model(MODEL)  # the student's call: Triton rereads the file
        assert served_groups() == [(2, "KIND_CPU")]
        lab.triton.configs.write_config(config_file, "dynamic_batching { preferred_batch_size: [ 4, 8 ] }")
        triton.load_model(MODEL)
        served = triton.get_model_config(MODEL)
        assert served["dynamic_batching"]["preferred_batch_size"] == [4, 8] and served_groups() == [(2, "KIND_CPU")]
        assert lab.triton.configuration(MODEL) == "2 instances, dynamic batching"  # how the lab names its runs
        assert capsys.readouterr().out.endswith(config_file.read_text() + "\n")
    finally:  # as the notebooks end: the file as it was, loaded again
        config_file.write_text(as_staged)
        triton.load_model(MODEL)
    assert served_groups() == [(1, "KIND_CPU")] and "dynamic_batching" not in triton.get_model_config(MODEL)
