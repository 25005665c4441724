"""An agent calling the OpenAI API for a while with one api key (its placeholder), through an
OAuth-backed gateway whose access token is refreshed meanwhile. Env: PREFIX (the upstream's env
variable prefix) and SECONDS. Prints {"ok": n, "failed": [...], "key": the key it used}."""

import json
import os
import time

from openai import OpenAI, OpenAIError

prefix = os.environ["PREFIX"]
key = os.environ[f"{prefix}_TOKEN"]
client = OpenAI(base_url=os.environ[f"{prefix}_URL"] + "/v1", api_key=key, max_retries=0)
ok, failed = 0, []
deadline = time.monotonic() + float(os.environ["SECONDS"])
while time.monotonic() < deadline:
    try:
        if ok % 5 == 0:
            client.chat.completions.create(model="gpt-demo", messages=[{"role": "user", "content": "hi"}])
        else:
            client.models.list()
        ok += 1
    except OpenAIError as exc:
        failed.append(type(exc).__name__ + ": " + str(exc)[:200])
    time.sleep(0.1)
print(json.dumps({"ok": ok, "failed": failed, "key": key}))
