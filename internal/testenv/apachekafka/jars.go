package apachekafka

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// POM is the Maven project that pins Apache Kafka, relative to the module
// root.
const POM = "test/kafka/pom.xml"

// Available reports whether this machine can run Apache Kafka clusters:
// Java and Maven are on PATH (JAVA_HOME's Java counts).
func Available() error {
	if _, err := Java(); err != nil {
		return err
	}
	if _, err := exec.LookPath("mvn"); err != nil {
		return errors.New("mvn (Maven) is not on PATH")
	}
	return nil
}

// Java returns the java command: $JAVA_HOME/bin/java when JAVA_HOME is set,
// else java on PATH.
func Java() (string, error) {
	if home := os.Getenv("JAVA_HOME"); home != "" {
		java := filepath.Join(home, "bin", "java")
		if _, err := os.Stat(java); err == nil {
			return java, nil
		}
	}
	java, err := exec.LookPath("java")
	if err != nil {
		return "", errors.New("java (17 or newer) is not on PATH and JAVA_HOME is not set")
	}
	return java, nil
}

// PinnedJars returns the directory of the jars of the Apache Kafka that
// this module pins (test/kafka/pom.xml), found from the working directory
// (a test's is its package's) and kept in DefaultCacheDir: what the tests,
// the chaos suite, the benchmark and make kafka all start clusters from.
func PinnedJars(ctx context.Context) (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	root, err := ModuleRoot(wd)
	if err != nil {
		return "", err
	}
	cache, err := DefaultCacheDir()
	if err != nil {
		return "", err
	}
	return Jars(ctx, filepath.Join(root, POM), cache)
}

// Jars returns the directory holding Apache Kafka's jars at the version
// pinned in pom (test/kafka/pom.xml), resolving them with Maven into
// cacheDir/kafka-<version>/libs on first use. Later calls, from any
// process, reuse that folder.
func Jars(ctx context.Context, pom, cacheDir string) (string, error) {
	version, err := PinnedVersion(pom)
	if err != nil {
		return "", err
	}
	libs := filepath.Join(cacheDir, "kafka-"+version, "libs")
	if complete(libs, version) {
		return libs, nil
	}
	if err := os.MkdirAll(filepath.Dir(libs), 0o755); err != nil {
		return "", err
	}
	// Resolve into a folder of this process's own and rename it into
	// place: test binaries of several packages may resolve at once.
	tmp, err := os.MkdirTemp(filepath.Dir(libs), "libs-*")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	cmd := exec.CommandContext(ctx, "mvn", "-q", "-B", "-f", pom,
		"dependency:copy-dependencies", "-DoutputDirectory="+tmp)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("resolve Apache Kafka %s with Maven (mvn -f %s dependency:copy-dependencies): %w\n%s", version, pom, err, out)
	}
	if !complete(tmp, version) {
		return "", fmt.Errorf("maven resolved no kafka_2.13-%s.jar into %s", version, tmp)
	}
	if err := os.Rename(tmp, libs); err != nil && !complete(libs, version) {
		return "", fmt.Errorf("move jars into %s: %w", libs, err)
	}
	return libs, nil
}

// complete reports whether dir holds a resolved Kafka of version.
func complete(dir, version string) bool {
	_, err := os.Stat(filepath.Join(dir, "kafka_2.13-"+version+".jar"))
	return err == nil
}

var versionProperty = regexp.MustCompile(`<kafka\.version>\s*([^<\s]+)\s*</kafka\.version>`)

// PinnedVersion reads the Kafka version pinned in pom.
func PinnedVersion(pom string) (string, error) {
	b, err := os.ReadFile(pom)
	if err != nil {
		return "", err
	}
	m := versionProperty.FindSubmatch(b)
	if m == nil {
		return "", fmt.Errorf("%s pins no <kafka.version>", pom)
	}
	return string(m[1]), nil
}

// DefaultCacheDir is where resolved jars are kept: $BILLING_CACHE_DIR, else
// the user's cache directory (~/.cache) under billing/.
func DefaultCacheDir() (string, error) {
	if d := os.Getenv("BILLING_CACHE_DIR"); d != "" {
		return d, nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(d, "billing"), nil
}

// ModuleRoot returns the directory of the go.mod above dir (a test's
// working directory is its package's directory).
func ModuleRoot(dir string) (string, error) {
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			if b, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && strings.HasPrefix(string(b), "module example.com/billing\n") {
				return d, nil
			}
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no billing go.mod above %s", dir)
		}
	}
}

// JavaMajor returns the major version of java.
func JavaMajor(java string) (int, error) {
	out, err := exec.Command(java, "-version").CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("%s -version: %w", java, err)
	}
	m := regexp.MustCompile(`version "(\d+)`).FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("cannot read the version of %s: %s", java, out)
	}
	return strconv.Atoi(string(m[1]))
}
