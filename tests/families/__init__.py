"""Families of samples written as a maintainer adds one (docs/adding-a-family.md): one folder each."""
