//! Tests of the GRAPH_COMPUTE steps.
