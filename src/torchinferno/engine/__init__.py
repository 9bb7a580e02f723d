"""Generation and the serving engine (scheduler, runner, LLM API)."""
