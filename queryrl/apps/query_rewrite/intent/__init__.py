"""Whether a rewrite keeps the customer's question: the offline check, its word lists and the LLM judge."""
