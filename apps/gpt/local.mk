# apps/gpt
