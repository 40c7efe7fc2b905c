# tests for runtime
