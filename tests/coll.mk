# tests for coll
