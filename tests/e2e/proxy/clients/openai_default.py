"""An agent's OpenAI calls with the SDK's defaults: key from OPENAI_API_KEY, base URL
https://api.openai.com/v1, proxy and CA from the environment (httpx trust_env).

Prints one JSON object: the completion, the streamed text and the model ids.
"""

import json

from openai import OpenAI

client = OpenAI(max_retries=0)
completion = client.chat.completions.create(
    model="gpt-demo", messages=[{"role": "user", "content": "Say hello to the proxy"}])
stream = client.chat.completions.create(
    model="gpt-demo", messages=[{"role": "user", "content": "Stream a hello"}], stream=True)
chunks = list(stream)

print(json.dumps({
    "base_url": str(client.base_url),
    "completion": completion.model_dump(mode="json"),
    "streamed": "".join(c.choices[0].delta.content or "" for c in chunks if c.choices),
    "chunks": len(chunks),
    "models": [m.id for m in client.models.list()],
}))
