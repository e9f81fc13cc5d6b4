"""The fake upstream's Bedrock wire, spoken to directly: what a real AWS client would see.

Requests are signed by botocore as an AWS SDK signs them; the answers are
read with botocore's own event-stream decoder, which checks every CRC.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import aiohttp
import orjson
import yarl
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.eventstream import EventStreamBuffer
from prism_fake_upstream import Fault
from prism_fake_upstream.bedrock_wire import ACCESS_KEY_ID, SECRET_ACCESS_KEY

BODY = {"messages": [{"role": "user", "content": [{"text": "Hello"}]}]}


async def post(
    fake: Any,
    scenario: str,
    operation: str,
    *,
    secret: str = SECRET_ACCESS_KEY,
    service: str = "bedrock",
    body: Any = BODY,
    sign: bool = True,
) -> tuple[int, dict[str, str], bytes]:
    url = f"{fake.base_url(scenario)}/model/{quote('m.x-v1:0', safe='')}/{operation}"
    payload = orjson.dumps(body)
    request = AWSRequest(
        method="POST", url=url, data=payload, headers={"Content-Type": "application/json"}
    )
    if sign:
        SigV4Auth(Credentials(ACCESS_KEY_ID, secret), service, "us-west-2").add_auth(request)
    async with aiohttp.ClientSession() as session:
        async with session.post(
            # As signed: aiohttp would otherwise unquote the model id's '%3A'.
            yarl.URL(url, encoded=True),
            data=payload,
            headers=dict(request.headers.items()),
        ) as got:
            return got.status, dict(got.headers), await got.read()


def frames(raw: bytes) -> list[tuple[dict[str, Any], Any]]:
    buffer = EventStreamBuffer()
    buffer.add_data(raw)
    return [(dict(m.headers), orjson.loads(m.payload)) for m in buffer]


async def test_a_signed_converse_call_is_answered(prism_fake):
    status, headers, body = await post(prism_fake, "ok", "converse")
    assert status == 200
    assert headers["Content-Type"] == "application/json"
    answer = orjson.loads(body)
    assert answer["output"]["message"]["content"] == [
        {"text": "Hello from m.x-v1:0. This is the fake upstream answering."}
    ]
    assert answer["stopReason"] == "end_turn"
    assert answer["usage"] == {"inputTokens": 1, "outputTokens": 9, "totalTokens": 10}


async def test_the_stream_is_real_event_stream_frames(prism_fake):
    prism_fake.script("ok", [Fault(text="one two")])
    status, headers, raw = await post(prism_fake, "ok", "converse-stream")
    assert status == 200
    assert headers["Content-Type"] == "application/vnd.amazon.eventstream"
    decoded = frames(raw)
    assert [h[":event-type"] for h, _ in decoded] == [
        "messageStart",
        "contentBlockDelta",
        "contentBlockDelta",
        "contentBlockStop",
        "messageStop",
        "metadata",
    ]
    assert all(h[":message-type"] == "event" for h, _ in decoded)
    assert all(h[":content-type"] == "application/json" for h, _ in decoded)
    assert [p["delta"]["text"] for h, p in decoded if h[":event-type"] == "contentBlockDelta"] == [
        "one",
        " two",
    ]
    assert decoded[-1][1]["usage"]["outputTokens"] == 2


async def test_an_exception_frame(prism_fake):
    prism_fake.script(
        "ok", [Fault(die_after_chunks=1, stream_error={"type": "throttlingException"})]
    )
    _, _, raw = await post(prism_fake, "ok", "converse-stream")
    headers, payload = frames(raw)[-1]
    assert headers[":message-type"] == "exception"
    assert headers[":exception-type"] == "throttlingException"
    assert isinstance(payload["message"], str)


async def test_a_wrong_secret_or_service_or_no_signature_is_refused(prism_fake):
    status, headers, body = await post(prism_fake, "ok", "converse", secret="nope")
    assert status == 403
    assert headers["x-amzn-ErrorType"].startswith("InvalidSignatureException")
    assert "signature we calculated does not match" in orjson.loads(body)["message"]
    status, headers, _ = await post(prism_fake, "ok", "converse", service="s3")
    assert (status, headers["x-amzn-ErrorType"].split(":")[0]) == (
        403,
        "InvalidSignatureException",
    )
    status, headers, _ = await post(prism_fake, "ok", "converse", sign=False)
    assert (status, headers["x-amzn-ErrorType"].split(":")[0]) == (
        403,
        "MissingAuthenticationTokenException",
    )


async def test_errors_carry_their_type_in_the_header(prism_fake):
    prism_fake.script(
        "ok",
        [
            Fault(status=429),
            Fault(status=400, headers={"x-amzn-ErrorType": "ServiceQuotaExceededException"}),
        ],
    )
    status, headers, body = await post(prism_fake, "ok", "converse")
    assert status == 429
    assert headers["x-amzn-ErrorType"].startswith("ThrottlingException")
    assert set(orjson.loads(body)) == {"message"}
    status, headers, _ = await post(prism_fake, "ok", "converse")
    assert (status, headers["x-amzn-ErrorType"].split(":")[0]) == (
        400,
        "ServiceQuotaExceededException",
    )
    status, headers, body = await post(prism_fake, "ok", "converse", body={"messages": []})
    assert status == 400
    assert headers["x-amzn-ErrorType"].startswith("ValidationException")
