# tests for fusion
