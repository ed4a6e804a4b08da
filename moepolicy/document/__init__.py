"""The policy file: its model (:mod:`.model`), its cross-field constraints
(:mod:`.constraints`), the light validator the runtime uses (:mod:`.fast_validate`), the reader
(:mod:`.reader`), YAML I/O (:mod:`.yaml_io`, :mod:`.facts_table`), the keys (:mod:`.keys`), the
JSON Schema (:mod:`.json_schema`) and the DeepEP section's builder (:mod:`.deepep_section`).

Light: nothing here imports torch or optuna (serving processes read policies; ``.importlinter``).
"""
