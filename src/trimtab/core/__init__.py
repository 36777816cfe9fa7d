"""The job's data model, standard library only: chunks, the placement map, wire dtypes,
named registries."""
