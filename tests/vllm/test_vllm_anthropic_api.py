"""Which vLLM releases serve the Anthropic Messages API at all, straight (no filter).

Releases in NO_MESSAGES_API answer 404 on `/v1/messages` and `/v1/messages/count_tokens`
(test_vllm_anthropic.py does not run on them); every other release serves both.
"""

import httpx

from tests.vllm.stack import MODEL, NO_MESSAGES_API


def test_messages_api_served_or_absent(vllm):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello there."}]}
    counted = httpx.post(vllm.url + "/v1/messages/count_tokens", json=body, timeout=60)
    served = httpx.post(vllm.url + "/v1/messages", json={**body, "max_tokens": 4}, timeout=180)
    if vllm.release in NO_MESSAGES_API:
        assert (counted.status_code, served.status_code) == (404, 404), (
            counted.text[:200], served.text[:200])
    else:
        assert counted.status_code == 200, counted.text[:300]
        assert served.status_code == 200, served.text[:300]
        assert counted.json()["input_tokens"] == served.json()["usage"]["input_tokens"]
