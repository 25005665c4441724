"""Demo upstreams for ``valetkey dev`` and the end-to-end tests: local servers that behave like the
real APIs as far as a client can tell, and accept only the real secret.

    common          the record of what arrived (``Seen``) and the 401-unless-real-secret wrapper
    openai_like     chat completions (plain and SSE) and models; Bearer
    anthropic_like  Messages (plain and SSE) and models; x-api-key, anthropic-version required
    github_like     one repository, its issues and comments, and a header-echo debug endpoint; Bearer
    git_http        ``git http-backend`` as CGI behind Basic auth (x-access-token:<secret>)
    policies        ``write_demo_policies``: the shipped policies' env and placements, on local ports
    servers         ``start_demo_upstreams``: each app under uvicorn in a background thread
"""
