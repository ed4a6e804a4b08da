"""The policy file: its model (:mod:`.model`), its cross-field constraints
(:mod:`.constraints`), the light validator the runtime uses (:mod:`.fast_validate`), the reader
(:mod:`.reader`), YAML I/O (:mod:`.yaml_io`, :mod:`.facts_table`), the keys (:mod:`.keys`), the
JSON Schema (:mod:`.json_schema`) and the composer (:mod:`.compose`), which maps a plan to the
document's sections (DeepEP's by :mod:`.deepep_section`, the experts' by :mod:`.experts_section`).

Light: nothing here imports torch or optuna (serving processes read policies; ``.importlinter``).
"""
