"""A sandboxed agent's Anthropic calls: configured from its environment only, as agents are.

Prints one JSON object: the message, its response headers, the streamed text and final message.
"""

import json
import os

from anthropic import Anthropic

client = Anthropic(base_url=os.environ["ANTHROPIC_BASE_URL"], api_key=os.environ["ANTHROPIC_API_KEY"],
                   max_retries=0)

raw = client.messages.with_raw_response.create(
    model="claude-demo", max_tokens=256, messages=[{"role": "user", "content": "Say hello to the gateway"}],
)
message = raw.parse()

with client.messages.stream(
    model="claude-demo", max_tokens=256, messages=[{"role": "user", "content": "Stream a hello"}],
) as stream:
    stream_headers = dict(stream.response.headers)
    pieces = list(stream.text_stream)
    final = stream.get_final_message()

print(json.dumps({
    "message": message.model_dump(mode="json"),
    "headers": dict(raw.headers),
    "stream_headers": stream_headers,
    "streamed": "".join(pieces),
    "pieces": len(pieces),
    "final": final.model_dump(mode="json"),
}))
