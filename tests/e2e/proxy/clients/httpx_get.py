"""An agent's own httpx calls: a plain ``httpx.Client()`` (trust_env: proxy and CA from the
environment), the GitHub token from GITHUB_TOKEN, the package index page without one.

Prints one JSON object: status and body of each response.
"""

import json
import os

import httpx

with httpx.Client(timeout=30) as client:
    issues = client.get("https://api.github.com/repos/acme/widgets/issues",
                        headers={"Authorization": f"Bearer {os.environ['GITHUB_TOKEN']}"})
    index = client.get("https://pypi.org/simple/valetkey-probe/")

print(json.dumps({
    "issues": {"status": issues.status_code, "body": issues.text, "headers": dict(issues.headers)},
    "index": {"status": index.status_code, "body": index.text},
}))
