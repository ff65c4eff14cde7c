//go:build !upgradetest

package charge

// A release writes no column beyond insertAttempts' own.
const nextColumns, nextValues = "", ""
