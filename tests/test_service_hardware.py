"""What a server's container has (servelab.service.hardware), and a Ray Serve config for it
(servelab.service.serve_config): served as written with a GPU per replica, with a share of the GPUs
with fewer, with a share of the cores without."""

from __future__ import annotations

import yaml

from servelab import paths
from servelab.service.hardware import Hardware
from servelab.service.serve_config import for_hardware, main

SHIPPED = yaml.safe_load((paths.RAY_SERVE_DIR / "serve_config.yaml").read_text())


def deployment(config):
    return config["applications"][0]["deployments"][0]


def test_a_record_of_the_hardware_reads_back_as_written(tmp_path):
    record = Hardware(gpus=2, cores=16, backends=("onnxruntime", "python"))
    record.write(tmp_path / "hardware.json")
    assert Hardware.read(tmp_path / "hardware.json") == record
    assert record.describe() == "2 GPU(s), 16 CPU core(s), backends onnxruntime, python"
    assert Hardware(0, 2).describe() == "no GPU, 2 CPU core(s)"


def test_with_a_gpu_for_each_replica_the_serve_config_is_served_as_written():
    assert deployment(SHIPPED)["autoscaling_config"]["max_replicas"] == 2  # the node's two GPUs
    assert for_hardware(SHIPPED, Hardware(gpus=2, cores=48)) is SHIPPED


def test_with_fewer_gpus_than_replicas_each_replica_reserves_a_share_of_them():
    served = deployment(for_hardware(SHIPPED, Hardware(gpus=1, cores=16)))
    assert served["ray_actor_options"]["num_gpus"] == 0.5  # both replicas fit on the one GPU
    assert "num_cpus" not in served["ray_actor_options"] and "INFERENCE_THREADS" not in str(served)
    fixed = {"applications": [{"deployments": [{"num_replicas": 3, "ray_actor_options": {"num_gpus": 1}}]}]}
    assert deployment(for_hardware(fixed, Hardware(gpus=2, cores=16)))["ray_actor_options"]["num_gpus"] == 0.667
    assert deployment(SHIPPED)["ray_actor_options"]["num_gpus"] == 1  # the shipped config is left as it was


def test_without_a_gpu_each_replica_reserves_a_share_of_the_cores_and_threads_to_match():
    served = deployment(for_hardware(SHIPPED, Hardware(gpus=0, cores=4)))
    replicas = deployment(SHIPPED)["autoscaling_config"]["max_replicas"]
    actor = served["ray_actor_options"]
    assert "num_gpus" not in actor and actor["num_cpus"] == round(4 / replicas, 3)
    assert actor["runtime_env"]["env_vars"]["INFERENCE_THREADS"] == str(int(4 / replicas))
    assert deployment(SHIPPED)["ray_actor_options"]["num_gpus"] == 1  # the shipped config is left as it was


def test_the_ray_container_s_start_writes_the_config_it_deploys_and_its_hardware(tmp_path):
    shipped = paths.RAY_SERVE_DIR / "serve_config.yaml"
    served, hardware_file = tmp_path / "served.yaml", tmp_path / "hardware.json"
    assert main([str(shipped), str(served), "--hardware", str(hardware_file)]) == 0
    assert yaml.safe_load(served.read_text()) == for_hardware(SHIPPED, Hardware.read(hardware_file))
