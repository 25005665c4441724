"""A sandboxed agent's OpenAI calls: configured from its environment only, as agents are.

Prints one JSON object: the completion, its response headers, the streamed text and chunk count.
"""

import json
import os

from openai import OpenAI

client = OpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"], max_retries=0)
messages = [{"role": "user", "content": "Say hello to the gateway"}]

raw = client.chat.completions.with_raw_response.create(model="gpt-demo", messages=messages)
completion = raw.parse()

with client.chat.completions.with_streaming_response.create(
    model="gpt-demo", messages=[{"role": "user", "content": "Stream a hello"}], stream=True,
    stream_options={"include_usage": True},
) as streamed:
    stream_headers = dict(streamed.headers)
    chunks = list(streamed.parse())

print(json.dumps({
    "completion": completion.model_dump(mode="json"),
    "headers": dict(raw.headers),
    "stream_headers": stream_headers,
    "streamed": "".join(c.choices[0].delta.content or "" for c in chunks if c.choices),
    "chunks": [c.model_dump(mode="json") for c in chunks],
    "models": [m.id for m in client.models.list()],
}))
