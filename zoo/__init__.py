"""Reference model revisions: tiny real LLMs with known, measurable differences."""
