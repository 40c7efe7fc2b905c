# tests/base.mk
