"""The local model family served by the local OpenAI-compatible server.

A response-selection policy over candidate responses (not a language model); see
:mod:`~nip_core.llm.policy.model` and ``nip_core/llm/README.md``.
"""
