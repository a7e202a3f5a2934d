"""The request schema POST /predict publishes says what the server takes (issue 31): every body of a
pool of values per field (absent, null, empty, malformed, well-formed) is sent to the service in this
process and judged by the schema itself (`jsonschema`).
"""

from __future__ import annotations

import base64
import itertools
import json

import jsonschema
import pytest

from food11 import BASE64_PATTERN, InvalidImageError, decode_base64
from servelab import paths
from tests.helpers import service_settings, serving

ABSENT = object()  # a field left out of the body


def value_pools(schema: dict, image_b64: str, host: str) -> dict[str, list]:
    """Values for each field the request schema names: what it allows and what it forbids."""
    fields = schema["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]["properties"]
    assert set(fields) == {"image", "url"}, f"the request's fields changed: {sorted(fields)}; update the pools"
    photo = f"http://{host}/{paths.SAMPLE_IMAGE.name}"
    return {
        "image": [
            ABSENT,
            None,
            "",
            "0",  # not base64: one character is never a whole group
            "%%% not base64 %%%",
            image_b64,
            image_b64 + "=",  # padding past the end
            base64.b64encode(b"hello, I am text").decode(),  # base64, but not an image: a documented 400
            12,
        ],
        "url": [
            ABSENT,
            None,
            "",
            photo,
            photo.replace("http://", "ftp://"),
            photo.replace("http://", "http://user:secret@"),
            "http://images.example.invalid/soup.jpg",  # a host not allowed: a documented 403
            f"http://{host}/no-such-photo.jpg",  # the image host fails: a documented 502
            "not a url",
        ],
    }


@pytest.mark.anyio
async def test_every_body_the_schema_allows_is_served_and_every_body_it_forbids_is_refused(photo_host, image_b64):
    async with serving(service_settings(photo_host.address)) as service:
        openapi = (await service.get("/openapi.json")).json()
        route = openapi["paths"]["/predict"]["post"]
        schema = {**route["requestBody"]["content"]["application/json"]["schema"], "components": openapi["components"]}
        validator = jsonschema.validators.validator_for(schema)(schema)
        documented = {int(code) for code in route["responses"]}
        assert {400, 403, 413, 422, 502, 504} <= documented
        # What a body the schema allows may still get, for what the schema cannot see: bytes that are not
        # an image, a URL the server does not fetch (403) or cannot get (502, 504). Never 422, never 500.
        refusals_beyond_the_schema = documented - {200, 422, 500}
        refusals = {status for status in documented if 400 <= status < 500}
        pools = value_pools(schema, image_b64, photo_host.address)
        # The edge cases the schema used to allow, and the two bodies every client sends.
        assert not validator.is_valid({}) and not validator.is_valid({"image": "0"})
        assert not validator.is_valid({"image": image_b64, "url": pools["url"][3]})
        assert validator.is_valid({"image": image_b64}) and validator.is_valid({"url": pools["url"][3]})
        wrong, answered = [], {True: 0, False: 0}
        bodies = [
            {name: value for name, value in zip(sorted(pools), values, strict=True) if value is not ABSENT}
            for values in itertools.product(*(pools[name] for name in sorted(pools)))
        ]
        for body in [*bodies, {"image": image_b64, "note": "a field the schema does not name"}]:
            allowed = validator.is_valid(body)
            response = await service.post("/predict", json=body)
            status = response.status_code
            if allowed:
                fine = status == 200 or status in refusals_beyond_the_schema
            else:
                fine = status in refusals and "detail" in response.json()
            answered[allowed] += status == 200
            if not fine:
                shown = {key: (value[:24] + "...") if isinstance(value, str) else value for key, value in body.items()}
                said = "allowed" if allowed else "forbidden"
                wrong.append(f"{json.dumps(shown)}: {said} by the schema, got {status}")
    assert not wrong, "\n".join(wrong)
    assert answered[False] == 0  # nothing the schema forbids was served
    assert answered[True] >= 4  # the photo, sent or by URL, each with the other field null; and with an extra field


def test_the_published_base64_pattern_is_what_the_decoder_takes():
    """Every string of up to 7 characters from base64's alphabet, its padding and a stranger:
    the schema's pattern (as jsonschema applies it) allows exactly those the decoder takes."""
    validator = jsonschema.Draft202012Validator({"type": "string", "pattern": BASE64_PATTERN})
    disagree = []
    for length in range(1, 8):
        for text in map("".join, itertools.product("A/=%", repeat=length)):
            try:
                decode_base64(text)
                decodes = True
            except InvalidImageError:
                decodes = False
            if validator.is_valid(text) != decodes:
                disagree.append(text)
    assert not disagree, f"pattern and decoder disagree on {disagree[:10]}"
    real = base64.b64encode(paths.SAMPLE_IMAGE.read_bytes()).decode()
    assert validator.is_valid(real) and decode_base64(real) == paths.SAMPLE_IMAGE.read_bytes()
