"""The store: the database, its tables and migrations, and the reads and writes over them."""
