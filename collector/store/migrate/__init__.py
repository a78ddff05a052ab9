"""Store room `migrate`: what makes the database (`jobpulse db upgrade`): migrations, the function
and view layer (`sql/`), the field table's columns, the ledger of objects, Citus placement."""
