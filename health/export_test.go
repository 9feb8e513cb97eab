package health

// WithLeaseLooked returns cfg with f called after each look of the loop
// at the lease (a renewal, or a standby's read of it).
func WithLeaseLooked(cfg Config, f func()) Config {
	cfg.leaseLooked = f
	return cfg
}
