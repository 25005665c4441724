"""An agent's Anthropic calls with the SDK's defaults: key from ANTHROPIC_API_KEY, base URL
https://api.anthropic.com, proxy and CA from the environment (httpx trust_env).

Prints one JSON object: the message and the streamed text.
"""

import json

from anthropic import Anthropic

client = Anthropic(max_retries=0)
message = client.messages.create(
    model="claude-demo", max_tokens=256, messages=[{"role": "user", "content": "Say hello to the proxy"}])
with client.messages.stream(
    model="claude-demo", max_tokens=256, messages=[{"role": "user", "content": "Stream a hello"}],
) as stream:
    pieces = list(stream.text_stream)

print(json.dumps({
    "base_url": str(client.base_url),
    "message": message.model_dump(mode="json"),
    "streamed": "".join(pieces),
    "pieces": len(pieces),
}))
