# tests for gpt
