# tests for bench
