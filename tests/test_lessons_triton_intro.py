"""Notebook 5's printouts, on a folder written here and on configs as Triton would report them."""

from servelab import paths
from servelab.lessons import triton_intro
from servelab.triton.config import TritonConfig

SHIPPED_FOLDER = paths.MODELS_STAGING_DIR / "food_classifier"
SHIPPED = TritonConfig.read(SHIPPED_FOLDER / "config.pbtxt")


def test_the_tree_draws_folders_before_their_files_sizes_in_kib_and_leaves_pycache_out(tmp_path):
    model = tmp_path / "food_classifier"
    (model / "1" / "__pycache__").mkdir(parents=True)
    (model / "1" / "__pycache__" / "model.cpython-312.pyc").write_bytes(b"x")
    (model / "1" / "model.py").write_bytes(b"x" * 2048)
    (model / "1" / "food11.pth").write_bytes(b"x" * 512)
    (model / "config.pbtxt").write_bytes(b"x" * 1024)
    assert triton_intro.tree(model).splitlines() == [
        "food_classifier/",
        "├── 1/",
        "│   ├── food11.pth (0.5 KiB)",
        "│   └── model.py (2.0 KiB)",
        "└── config.pbtxt (1.0 KiB)",
    ]


def test_an_empty_folder_is_its_name_alone(tmp_path):
    (tmp_path / "x").mkdir()
    assert triton_intro.tree(tmp_path / "x") == "x/"


def test_the_served_config_is_described_beside_what_config_pbtxt_asked_for():
    served = {
        "name": "food_classifier",
        "backend": "python",
        "max_batch_size": 16,
        "instance_group": [{"count": 2, "kind": "KIND_CPU"}, {"count": 1, "kind": "KIND_GPU", "gpus": [0, 1]}],
        "dynamic_batching": {},
        "parameters": {"weights": {"string_value": "untrained"}, "weights_note": {"string_value": "a long text"}},
    }
    assert triton_intro.describe_served(SHIPPED_FOLDER, served).splitlines() == [
        "food_classifier",
        "  backend:        config.pbtxt asks for 'python'; Triton runs 'python'",
        "  max_batch_size: 16",
        "  instance group: 2 x KIND_CPU",
        "  instance group: 1 x KIND_GPU on GPUs [0, 1]",
        "  dynamic batching: on",
        "  parameter weights: untrained",
    ]


def test_a_stateful_model_s_sequence_strategy_is_named():
    served = {"backend": "python", "max_batch_size": 8, "sequence_batching": {"direct": {}}}
    described = triton_intro.describe_served(SHIPPED_FOLDER, served).splitlines()
    assert described[-2:] == ["  dynamic batching: off", "  sequence batching: on, strategy direct"]
    served["sequence_batching"] = {"oldest": {"max_candidate_sequences": 4}}
    assert triton_intro.describe_served(SHIPPED_FOLDER, served).endswith("strategy oldest")


def test_a_config_loaded_as_shipped_says_so_and_an_adapted_one_shows_its_diff(tmp_path):
    (tmp_path / "config.pbtxt").write_text(SHIPPED.text)
    assert triton_intro.changes_on_load(SHIPPED_FOLDER, tmp_path) == (
        "food_classifier: Triton loads models_staging/food_classifier/config.pbtxt unchanged.\n"
    )
    on_cpu = SHIPPED.with_instance_groups([{"count": 1, "kind": "KIND_CPU"}])
    (tmp_path / "config.pbtxt").write_text(on_cpu.text)
    changes = triton_intro.changes_on_load(SHIPPED_FOLDER, tmp_path)
    assert changes.startswith("--- models_staging/food_classifier/config.pbtxt\n")
    assert f"+++ {tmp_path / 'config.pbtxt'} (what Triton loads)" in changes
    assert "-    kind: KIND_GPU" in changes and "+    kind: KIND_CPU" in changes
