package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// variant is one shape of the dedup table. Each lives in its own schema as
// a table named processed_event, so that billing's own dedup.Store, whose SQL
// names processed_event unqualified, inserts into it through search_path.
type variant struct {
	Name        string `json:"name"`
	Schema      string `json:"schema"`
	Keys        string `json:"keys"` // "v7" or "v4"
	Partitioned bool   `json:"partitioned"`
}

func (v variant) table() string { return v.Schema + ".processed_event" }

var (
	partitionedV7 = variant{Name: "v7, partitioned by day (billing)", Schema: "public", Keys: "v7", Partitioned: true}
	plainV7       = variant{Name: "v7, one table", Schema: "v7plain", Keys: "v7"}
	plainV4       = variant{Name: "v4, one table", Schema: "v4plain", Keys: "v4"}
	variants      = []variant{partitionedV7, plainV7, plainV4}
)

// Results is everything the benchmark measured, as written by -out.
type Results struct {
	Started  time.Time      `json:"started"`
	Wall     time.Duration  `json:"wall_ns"`
	Config   Config         `json:"config"`
	Machine  Machine        `json:"machine"`
	Loads    []LoadResult   `json:"loads"`
	Inserts  []InsertResult `json:"inserts"`
	Removals []RemoveResult `json:"removals"`
}

// Machine describes where the figures come from.
type Machine struct {
	CPUs      int               `json:"cpus"`
	MemTotal  string            `json:"mem_total"`
	Server    string            `json:"server"`
	Settings  map[string]string `json:"settings"`
	LoadStart string            `json:"loadavg_start"`
	LoadEnd   string            `json:"loadavg_end"`
	HasStat   bool              `json:"pgstattuple"`
}

// Sizes are a table's on-disk figures, summed over its partitions.
type Sizes struct {
	Partitions int   `json:"partitions"`
	Heap       int64 `json:"heap_bytes"`    // main fork of the table(s)
	PKey       int64 `json:"pkey_bytes"`    // pg_relation_size of the primary key index(es)
	Indexes    int64 `json:"indexes_bytes"` // pg_indexes_size
	Total      int64 `json:"total_bytes"`   // pg_total_relation_size
	// From pgstatindex, when asked for and available.
	LeafPages   int64   `json:"leaf_pages"`
	LeafDensity float64 `json:"leaf_density_pct"` // avg_leaf_density weighted by leaf pages
	FreePages   int64   `json:"free_pages"`       // empty_pages + deleted_pages: reusable, still in the file
	Levels      int     `json:"btree_levels"`     // deepest tree_level + 1
}

// WAL is the write-ahead log written during a measurement.
type WAL struct {
	// Cluster is the advance of pg_current_wal_lsn(): every database's WAL,
	// other engineers' tests included.
	Cluster int64 `json:"cluster_bytes"`
	// Ours and OursFPI are the records, and the full-page images in them,
	// that touch the benchmark database's relations, read back with
	// pg_walinspect; -1 when that was not possible. Commit records name no
	// relation and are left out: some 40 bytes a transaction.
	Ours    int64 `json:"ours_bytes"`
	OursFPI int64 `json:"ours_fpi_bytes"`
	// Checkpoints that happened during the measurement, ours excluded.
	Checkpoints int64 `json:"checkpoints"`
}

func (w WAL) add(o WAL) WAL {
	s := WAL{Cluster: w.Cluster + o.Cluster, Ours: -1, OursFPI: -1, Checkpoints: w.Checkpoints + o.Checkpoints}
	if w.Ours >= 0 && o.Ours >= 0 {
		s.Ours, s.OursFPI = w.Ours+o.Ours, w.OursFPI+o.OursFPI
	}
	return s
}

// LoadResult is one table's bulk pre-fill.
type LoadResult struct {
	Variant variant       `json:"variant"`
	Rows    int64         `json:"rows"`
	Took    time.Duration `json:"took_ns"`
	Vacuum  time.Duration `json:"vacuum_analyze_ns"`
	Sizes   Sizes         `json:"sizes"`
}

// InsertResult is one round of steady-state inserts.
type InsertResult struct {
	Variant    variant       `json:"variant"`
	SyncCommit string        `json:"synchronous_commit"`
	Round      int           `json:"round"`
	RowsBefore int64         `json:"rows_before"`
	Rows       int64         `json:"rows_inserted"`
	Elapsed    time.Duration `json:"elapsed_ns"`
	RowsPerSec float64       `json:"rows_per_sec"`
	Tx         latencies     `json:"tx"`
	WAL        WAL           `json:"wal"`
	IdxRead    int64         `json:"idx_blks_read"`
	IdxHit     int64         `json:"idx_blks_hit"`
	HeapRead   int64         `json:"heap_blks_read"`
	PKeyGrowth int64         `json:"pkey_growth_bytes"`
	Load       string        `json:"loadavg_end"`
	samples    []sample
}

// RemoveResult is one removal of a day of rows.
type RemoveResult struct {
	Variant     variant       `json:"variant"`
	Method      string        `json:"method"`
	Day         string        `json:"day"`
	UnderLoad   bool          `json:"under_load"`
	Rows        int64         `json:"rows_removed"`
	Took        time.Duration `json:"took_ns"`
	Batches     int           `json:"transactions"`
	Slowest     time.Duration `json:"slowest_transaction_ns"`
	WAL         WAL           `json:"wal"`
	Before      Sizes         `json:"before"`
	After       Sizes         `json:"after"`
	DeadTuples  int64         `json:"n_dead_tup_after"`
	Vacuum      time.Duration `json:"vacuum_ns,omitempty"`
	VacuumWAL   *WAL          `json:"vacuum_wal,omitempty"`
	AfterVacuum *Sizes        `json:"after_vacuum,omitempty"`
	// pgstattuple of the heap after the removal and after the VACUUM.
	DeadPct       float64 `json:"pgstattuple_dead_pct_after"`
	FreePct       float64 `json:"pgstattuple_free_pct_after"`
	FreePctVacuum float64 `json:"pgstattuple_free_pct_after_vacuum"`
	// Concurrent inserts into the same table, under load only: before the
	// removal started and while it ran.
	InsBefore latencies `json:"inserts_before"`
	InsDuring latencies `json:"inserts_during"`
}

// latencies summarizes insert transactions.
type latencies struct {
	N          int           `json:"tx"`
	P50        time.Duration `json:"p50_ns"`
	P99        time.Duration `json:"p99_ns"`
	Max        time.Duration `json:"max_ns"`
	RowsPerSec float64       `json:"rows_per_sec"`
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func memTotal() string {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return "?"
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			if kb, err := strconv.ParseInt(f[1], 10, 64); err == nil {
				return fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
			}
		}
	}
	return "?"
}
