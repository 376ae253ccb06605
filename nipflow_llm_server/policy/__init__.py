"""The local model family served by the local OpenAI-compatible server.

A response-selection policy over candidate responses (not a language model); see
:mod:`~nipflow_llm_server.policy.model` and ``nipflow_llm_server/README.md``.
"""
