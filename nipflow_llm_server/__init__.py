"""The local OpenAI-compatible server: a service beside the domain library, not part of it.

Its server (``server/``), engines (``engines/``), the selection policy (``policy/``), the
launcher and the test helper; see ``nipflow_llm_server/README.md``. ``nip_core`` never
imports this package: it finds the launcher through the entry point
``nipflow.local_openai_server`` (``nip_core/llm/local_server.py``).
"""
