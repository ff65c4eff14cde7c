package charge

// ForOrdersQuery is ForOrders' statement, for the test of its plan.
const ForOrdersQuery = forOrders
