"""Hub sources: APIBench parsing (apibench.py), the prompt and answer format of every row
(prompt.py) and the leakage and duplicate rules (validate.py), below retrieval and the chat builder."""
