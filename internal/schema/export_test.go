package schema

// MigrateFS and MigrationsOf let the tests run migration sets of their own.
var (
	MigrateFS    = migrate
	MigrationsOf = migrationsOf
)
