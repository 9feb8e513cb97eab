package config

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strings"
)

// Secret is a value that must never be logged, printed or published. Every
// way fmt, slog, JSON or YAML would show it says "[redacted]"; Reveal
// returns the value for the one place that needs it.
type Secret string

const redacted = "[redacted]"

// Reveal returns the secret itself.
func (s Secret) Reveal() string { return string(s) }

// String, GoString, LogValue, MarshalText and MarshalYAML redact it.
func (s Secret) String() string               { return redacted }
func (s Secret) GoString() string             { return redacted }
func (s Secret) LogValue() slog.Value         { return slog.StringValue(redacted) }
func (s Secret) MarshalText() ([]byte, error) { return []byte(redacted), nil }
func (s Secret) MarshalYAML() (any, error)    { return redacted, nil }

// maxPasswordLen is the longest password a guest's proxy server can check
// in full: bcrypt, which the guests' password files use, reads 72 bytes.
const maxPasswordLen = 72

// LoadSecrets reads the secrets the config names: the proxies' password,
// from proxy.auth.password_file or else from the environment variable
// PasswordEnv (getenv; nil means os.Getenv). A role that needs them (serve,
// worker, health) calls it at start, so a missing, unreadable or empty
// secret stops it there, naming the field; the client verbs, which only
// need the NATS settings, do not. Only the trailing newline of a file is
// dropped.
func (c *Config) LoadSecrets(getenv func(string) string) error {
	if getenv == nil {
		getenv = os.Getenv
	}
	a := &c.Proxy.Auth
	if a.User == "" {
		return nil
	}
	var pw string
	switch {
	case a.PasswordFile != "":
		var err error
		if pw, err = readPasswordFile("proxy.auth.password_file", a.PasswordFile); err != nil {
			return err
		}
	case getenv(PasswordEnv) != "":
		pw = getenv(PasswordEnv)
		if err := checkPassword(pw); err != nil {
			return bad("proxy.auth.password_file", "the password from $%s: %v", PasswordEnv, err)
		}
	default:
		return bad("proxy.auth.password_file", "required with proxy.auth.user (or set $%s)", PasswordEnv)
	}
	a.Password = Secret(pw)
	return nil
}

// checkPassword accepts what every proxy server and client of the fleet
// carries unchanged: printable ASCII, at most maxPasswordLen bytes. The
// error never quotes the password.
func checkPassword(pw string) error {
	if len(pw) > maxPasswordLen {
		return fmt.Errorf("the password is %d bytes long; at most %d (bcrypt reads no more)", len(pw), maxPasswordLen)
	}
	for i := 0; i < len(pw); i++ {
		if c := pw[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("the password has a byte outside printable ASCII at offset %d", i)
		}
	}
	return nil
}

// LoadGatewaySecrets reads the gateway users' passwords from their
// password_file: the gateway role, and serve when gateway.listen is set,
// call it at start.
func (c *Config) LoadGatewaySecrets() error {
	for i := range c.Gateway.Users {
		u := &c.Gateway.Users[i]
		pw, err := readPasswordFile(fmt.Sprintf("gateway.users[%d].password_file", i), u.PasswordFile)
		if err != nil {
			return err
		}
		u.Password = Secret(pw)
	}
	return nil
}

// LoadConsoleSecrets reads the console users' passwords from their
// password_file: the console role, and serve when console.listen is set,
// call it at start, so a missing or empty file stops the start.
func (c *Config) LoadConsoleSecrets() error {
	for i := range c.Console.Users {
		u := &c.Console.Users[i]
		pw, err := readPasswordFile(fmt.Sprintf("console.users[%d].password_file", i), u.PasswordFile)
		if err != nil {
			return err
		}
		u.Password = Secret(pw)
	}
	return nil
}

// readPasswordFile reads a password from file, for the config field
// field: it must exist and hold one (only the trailing newline is
// dropped), which checkPassword accepts.
func readPasswordFile(field, file string) (string, error) {
	b, err := os.ReadFile(file)
	if errors.Is(err, fs.ErrNotExist) {
		return "", bad(field, "%s does not exist", file)
	}
	if err != nil {
		return "", bad(field, "%v", err)
	}
	pw := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if pw == "" {
		return "", bad(field, "%s is empty", file)
	}
	if err := checkPassword(pw); err != nil {
		return "", bad(field, "%s: %v", file, err)
	}
	return pw, nil
}
