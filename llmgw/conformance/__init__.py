"""The API conformance matrix: every row either works or returns a clear error.

Issue 31: users found tools silently dropped, and requests OpenAI refuses
accepted. A row here calls a running gateway with an official client (the
`openai` SDK, the `anthropic` SDK, the OpenAI Agents SDK) and says one of
three things: it works, it is refused with a clear error in the API's own
shape, or it fails (a silent drop, a wrong shape, a crash). The matrix is
printed by `python -m llmgw.conformance` (see matrix.py); the end-to-end tests
run the same rows against `llmgw up` with the real demo model.

Rows live in one module per API (openai_rows, responses_rows,
anthropic_rows), each exposing `ROWS`; matrix.py gathers those that exist.
"""
