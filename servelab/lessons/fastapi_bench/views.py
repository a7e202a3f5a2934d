"""What notebook 4 prints: what /openapi.json says about /predict (`describe_predict`), and the
resources a run's sampler saw, in words (`usage_text`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from servelab.lessons.expectations import machine_cores
from servelab.measure.resources import summarize


def describe_predict(openapi: dict[str, Any]) -> str:
    """What an OpenAPI document (a FastAPI service's /openapi.json) says about POST /predict: its
    JSON request body's schema, and each answer it documents with the fields of its body, every
    `$ref` followed into the document's components/schemas."""
    schemas = openapi.get("components", {}).get("schemas", {})

    def resolve(schema: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in schema:
            schema = schemas[schema["$ref"].rsplit("/", 1)[1]]
        return schema

    def json_schema(part: dict[str, Any]) -> dict[str, Any]:
        return resolve(part.get("content", {}).get("application/json", {}).get("schema", {}))

    operation = openapi["paths"]["/predict"]["post"]
    request = json.dumps(json_schema(operation["requestBody"]), indent=2)
    lines = ["POST /predict, request body:", request, "", "Answers:"]
    for status, answer in operation["responses"].items():
        fields = ", ".join(json_schema(answer).get("properties", {})) or "no body"
        lines.append(f"  {status}: {answer.get('description', '')} (fields: {fields})")
    return "\n".join(lines)


def usage_text(series: Mapping[str, Any], cores: int | None = None) -> str:
    """The resources a ResourceSampler saw (`series`, a RunResult's `resources`), in words: the
    whole machine's CPU on `cores` cores (those this process may use, unless given), each GPU's use
    (or how none was read), and the server process's own CPU where it was sampled."""
    cores = machine_cores() if cores is None else cores
    usage = summarize(dict(series))
    gpus = ", ".join(
        f"{gpu['name']} {gpu['util_percent_mean']}% busy on average (peak {gpu['util_percent_max']}%)"
        for gpu in usage["gpus"]
    )
    lines = [
        f"The whole machine: CPU {usage['cpu_percent_mean']}% of all {cores} cores on average "
        f"(peak {usage['cpu_percent_max']}%); GPU: {gpus or usage['gpu_source']}"
    ]
    if "process_cpu_percent_mean" in usage:
        server = usage["process_cpu_percent_mean"]
        lines.append(
            f"The server process alone: {server}% of one core on average, i.e. {server / cores:.0f}% of all "
            f"{cores} cores, the unit of the plot's thick line."
        )
    return "\n".join(lines)
