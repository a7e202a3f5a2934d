"""Editing Triton configs: real config text in, minimal text changes out, checked by Triton's schema."""

import pytest

from servelab import paths
from servelab.service.hardware import Hardware
from servelab.triton.adaptation import adapt_to_server
from servelab.triton.config import ConfigError, TritonConfig
from servelab.triton.models import ModelRepository
from servelab.triton.server import LOCAL_TRITON

SHIPPED = {model.name: model.config for model in ModelRepository()}

# A config in the shipped style with nested blocks, comments inside them, and braces inside
# strings and comments: everything a naive pattern match gets wrong.
NESTED = """\
# Comment at the top { with a brace }
name: "nested"
backend: "python"
max_batch_size: 8
input [ { name: "X", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "Y", data_type: TYPE_FP32, dims: [ 4 ] } ]
dynamic_batching {
  # Why these sizes: teaching material that must survive an edit.
  preferred_batch_size: [ 2, 4 ]
  default_queue_policy {
    # Refuse rather than queue forever.
    timeout_action: REJECT
    max_queue_size: 4
  }
  max_queue_delay_microseconds: 100
}
parameters {
  key: "note"
  value: { string_value: "a } in a string" }
}
instance_group [ { count: 1, kind: KIND_CPU } ]
"""


def changed_lines(diff: str) -> list[str]:
    return [line for line in diff.splitlines() if line[:1] in "+-" and not line.startswith(("+++", "---"))]


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_every_shipped_config_parses_and_an_empty_edit_changes_nothing(name):
    config = SHIPPED[name]
    assert config.name == name
    assert config.with_proto(config.proto).text == config.text
    assert config.edit(lambda proto: None).diff(config) == ""


def test_an_edit_inside_a_nested_block_changes_only_that_line_and_keeps_every_comment():
    config = TritonConfig(NESTED, "nested/config.pbtxt")
    policy = {"timeout_action": "REJECT", "max_queue_size": 16}
    edited = config.with_dynamic_batching(
        preferred_batch_size=[2, 4], default_queue_policy=policy, max_queue_delay_microseconds=100
    )
    assert changed_lines(config.diff(edited)) == ["-    max_queue_size: 4", "+    max_queue_size: 16"]
    assert edited.proto.dynamic_batching.default_queue_policy.max_queue_size == 16
    for line in NESTED.splitlines():
        if line.lstrip().startswith("#"):
            assert line in edited.text
    # Everything after the nested block is intact (a pattern stopping at the first "}" loses it).
    assert edited.proto.parameters["note"].string_value == "a } in a string"
    assert edited.proto.instance_group[0].count == 1


def test_replacing_a_block_with_nested_blocks_rewrites_all_of_it_and_nothing_else():
    config = TritonConfig(NESTED, "nested/config.pbtxt")
    edited = config.with_dynamic_batching(max_queue_delay_microseconds=500)
    batching = edited.proto.dynamic_batching
    assert list(batching.preferred_batch_size) == [] and not batching.HasField("default_queue_policy")
    assert batching.max_queue_delay_microseconds == 500
    removed = [line for line in changed_lines(config.diff(edited)) if line.startswith("-")]
    assert "-    max_queue_size: 4" in removed and not any("parameters" in line or "name:" in line for line in removed)
    assert edited.proto.parameters["note"].string_value == "a } in a string"


def test_dynamic_batching_is_added_at_the_end_in_the_shipped_style():
    config = SHIPPED["food_classifier_onnx"]
    edited = config.with_dynamic_batching(preferred_batch_size=[4, 6, 8], max_queue_delay_microseconds=100)
    assert changed_lines(config.diff(edited)) == [
        "+dynamic_batching {",
        "+  preferred_batch_size: [ 4, 6, 8 ]",
        "+  max_queue_delay_microseconds: 100",
        "+}",
    ]
    assert edited.without("dynamic_batching").text == config.text


def test_instance_groups_are_rewritten_item_by_item_in_the_order_the_file_uses():
    config = SHIPPED["food_classifier"]
    edited = config.with_instance_groups(
        [{"count": 2, "kind": "KIND_GPU", "gpus": [0]}, {"count": 2, "kind": "KIND_GPU", "gpus": [1]}]
    )
    assert changed_lines(config.diff(edited)) == [
        "-    count: 1",
        "+    count: 2",
        "+  },",
        "+  {",
        "+    count: 2",
        "+    kind: KIND_GPU",
        "+    gpus: [ 1 ]",
    ]
    assert edited.instance_count() == 4 and config.instance_count() == 1


def test_sequence_batching_and_parameters_can_be_set():
    config = SHIPPED["food_classifier"]
    edited = config.with_sequence_batching(
        max_sequence_idle_microseconds=5_000_000,
        oldest={"max_candidate_sequences": 4},
        control_input=[{"name": "START", "control": [{"kind": "CONTROL_SEQUENCE_START", "int32_false_true": [0, 1]}]}],
    ).with_parameters(note='quoted "text"')
    proto = edited.proto
    assert proto.sequence_batching.oldest.max_candidate_sequences == 4
    assert proto.sequence_batching.control_input[0].control[0].int32_false_true == [0, 1]
    assert proto.parameters["note"].string_value == 'quoted "text"'
    assert TritonConfig(edited.text).proto == proto


def test_the_sequence_strategy_changes_and_the_control_inputs_and_idle_limit_stay():
    config = SHIPPED["food_classifier"].with_sequence_batching(
        max_sequence_idle_microseconds=5_000_000,
        oldest={"max_candidate_sequences": 4},
        control_input=[{"name": "START", "control": [{"kind": "CONTROL_SEQUENCE_START", "int32_false_true": [0, 1]}]}],
    )
    direct = config.with_sequence_strategy("direct", max_queue_delay_microseconds=2000).proto.sequence_batching
    assert direct.WhichOneof("strategy_choice") == "direct" and direct.direct.max_queue_delay_microseconds == 2000
    assert direct.max_sequence_idle_microseconds == 5_000_000 and direct.control_input[0].name == "START"
    oldest = config.with_sequence_strategy("oldest").proto.sequence_batching
    assert oldest.WhichOneof("strategy_choice") == "oldest" and oldest.oldest.max_candidate_sequences == 0
    with pytest.raises(ConfigError, match="'direct' and 'oldest'"):
        config.with_sequence_strategy("newest")
    with pytest.raises(ConfigError, match="not stateful"):
        SHIPPED["food_classifier"].with_sequence_strategy("direct")
    with pytest.raises(ConfigError, match="cannot set the direct strategy"):
        config.with_sequence_strategy("direct", max_candidate_sequences=4)  # an `oldest` setting


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c.with_dynamic_batching(prefered_batch_size=[4]), 'no field named "prefered_batch_size"'),
        (lambda c: c.with_dynamic_batching(preferred_batch_size=[32]), "between 1 and max_batch_size \\(16\\)"),
        (lambda c: c.with_fields(max_batch=8), "no field 'max_batch'.*max_batch_size"),
        (lambda c: c.with_instance_groups([{"count": 1, "kind": "KIND_TPU"}]), "KIND_TPU"),
        (lambda c: c.with_instance_groups([{"count": 1, "kind": "KIND_CPU", "gpus": [0]}]), "cannot list gpus"),
        (lambda c: TritonConfig(c.text + "dynamic_batching { }\nsequence_batching { }\n"), "oneof"),
    ],
)
def test_a_bad_edit_fails_here_with_a_message_that_says_what_is_wrong(edit, message):
    with pytest.raises(ConfigError, match=message):
        edit(SHIPPED["food_classifier"])


def test_hand_edited_text_is_checked_against_the_schema_with_the_line_number():
    broken = SHIPPED["food_classifier"].text.replace("max_batch_size: 16", "max_batch_sise: 16")
    line = broken.splitlines().index("max_batch_sise: 16") + 1
    with pytest.raises(ConfigError, match=f"edited/config.pbtxt: {line}:1 .*max_batch_sise"):
        TritonConfig(broken, "edited/config.pbtxt")


def test_the_local_adaptation_runs_gpu_configs_on_the_cpu_and_says_what_serves_onnx():
    weights = {"weights": "untrained", "weights_note": "seeded, never trained"}
    onnx = adapt_to_server(SHIPPED["food_classifier_onnx"], LOCAL_TRITON, weights).proto
    assert onnx.backend == "python" and "ONNX Runtime" in onnx.parameters["served_by"].string_value
    assert onnx.parameters["weights"].string_value == "untrained"
    grouped = SHIPPED["food_classifier"].with_instance_groups([{"count": 2, "kind": "KIND_GPU", "gpus": [0, 1]}])
    adapted = adapt_to_server(grouped, LOCAL_TRITON)
    (group,) = adapted.proto.instance_group
    assert (group.count, group.kind, list(group.gpus)) == (2, group.KIND_CPU, [])
    assert "served_by" not in adapted.proto.parameters


def test_on_the_gpu_node_s_image_a_config_is_served_as_written_with_its_weights_record():
    gpu_node = Hardware(gpus=2, cores=16, backends=("onnxruntime", "python", "pytorch"))
    grouped = SHIPPED["food_classifier"].with_instance_groups([{"count": 2, "kind": "KIND_GPU", "gpus": [0, 1]}])
    adapted = adapt_to_server(grouped, gpu_node, {"weights": "untrained"})
    (group,) = adapted.proto.instance_group
    assert (group.count, group.kind, list(group.gpus)) == (2, group.KIND_GPU, [0, 1])
    assert adapted.proto.parameters["weights"].string_value == "untrained"
    onnx = adapt_to_server(SHIPPED["food_classifier_onnx"], gpu_node).proto
    assert onnx.backend == "onnxruntime" and "served_by" not in onnx.parameters
    # A GPU server without the ONNX Runtime backend keeps its GPUs and serves the graph with Python.
    no_onnx = adapt_to_server(SHIPPED["food_classifier_onnx"], Hardware(1, 8, ("python",))).proto
    assert no_onnx.backend == "python" and no_onnx.instance_group[0].kind == no_onnx.instance_group[0].KIND_GPU


def test_the_adaptation_refuses_a_backend_the_server_cannot_run_and_says_what_to_do():
    tensorrt = SHIPPED["food_classifier_onnx"].with_fields(backend="tensorrt")
    with pytest.raises(
        ConfigError, match="backend 'tensorrt' is not in this Triton server, which has python.*Python-backend"
    ):
        adapt_to_server(tensorrt, LOCAL_TRITON)


def test_a_config_read_from_a_file_names_its_origin_in_errors(tmp_path):
    path = tmp_path / "config.pbtxt"
    path.write_text('name: "x"\nmax_batch_size: "sixteen"\n')
    with pytest.raises(ConfigError, match=str(path)):
        TritonConfig.read(path)
    assert TritonConfig.read(paths.MODELS_STAGING_DIR / "food_classifier" / "config.pbtxt").name == "food_classifier"


def test_a_typed_block_replaces_its_field_and_keeps_the_rest_of_the_text():
    """What the student types in notebooks 6 (instance groups) and 7 (dynamic batching): one top-level
    field as config.pbtxt text."""
    shipped = SHIPPED["food_classifier"]
    typed = "instance_group [ { count: 2, kind: KIND_GPU, gpus: [ 0 ] }, { count: 2, kind: KIND_GPU, gpus: [ 1 ] } ]"
    edited = shipped.with_text(typed)
    assert edited.instance_count() == 4
    # The same text as the edit made from Python values: only the lines that differ are rewritten.
    assert (
        edited.text
        == shipped.with_instance_groups(
            [{"count": 2, "kind": "KIND_GPU", "gpus": [0]}, {"count": 2, "kind": "KIND_GPU", "gpus": [1]}]
        ).text
    )
    # On a server with no GPU, the typed GPU groups run as as many CPU instances.
    served = adapt_to_server(edited, LOCAL_TRITON).proto
    cpu = served.instance_group[0].KIND_CPU
    assert [(group.count, group.kind, list(group.gpus)) for group in served.instance_group] == [(2, cpu, [])] * 2
    batching = shipped.with_text(
        "dynamic_batching {\n  preferred_batch_size: [ 4, 8 ]\n  max_queue_delay_microseconds: 100\n}"
    )
    assert changed_lines(shipped.diff(batching)) == [
        "+dynamic_batching {",
        "+  preferred_batch_size: [ 4, 8 ]",
        "+  max_queue_delay_microseconds: 100",
        "+}",
    ]
    assert shipped.with_text("dynamic_batching { }").proto.HasField("dynamic_batching")


@pytest.mark.parametrize(
    ("typed", "message"),
    [
        # A misspelt field is named, with the field meant, and the line it is on.
        (
            "instance_group [ { cont: 2, kind: KIND_GPU } ]",
            "line 1: an instance_group has no field 'cont'; did you mean 'count'",
        ),
        (
            "dynamic_batching {\n  max_queue_delay_microsecond: 100\n}",
            "line 2: a dynamic_batching has no field 'max_queue_delay_microsecond'; "
            "did you mean 'max_queue_delay_microseconds'",
        ),
        ("instance_group [ { count: 2, kind: GPU } ]", "kind has no value 'GPU'; it has: KIND_AUTO, KIND_GPU"),
        # A block for a field a model config does not have.
        ("queue_limit { size: 4 }", "a model config has no field 'queue_limit'; it has: .*instance_group"),
        ("", "the text writes no field"),
        ("instance_group [ { count: 2 ]", "line 1: .*Expected identifier"),
        ("dynamic_batching { preferred_batch_size: [ 32 ] }", "between 1 and max_batch_size \\(16\\)"),
    ],
)
def test_a_typed_block_that_triton_would_refuse_fails_here_naming_what_is_wrong(typed, message):
    with pytest.raises(ConfigError, match=message):
        SHIPPED["food_classifier"].with_text(typed)
