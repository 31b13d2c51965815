"""The router: the OpenAI-compatible proxy every user request passes through."""
